"""Training and evaluating a token model with memory: the next-token NLL, ``lm_loss`` (the memory
as ``fit``'s carry, reset where a stream's pass begins; its resume), the LM batches whose
``reset`` it reads (``dq.data.LMBatches``), and ``evaluate_lm``."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import deqjax as dq

B, T, M, D = 2, 4, 3, 8


def _normal(key: int, shape) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float64)


def test_token_nll_is_the_mean_negative_log_likelihood():
    logits = _normal(0, (B, T, 5))
    targets = jnp.arange(B * T).reshape(B, T) % 5
    logp = jax.nn.log_softmax(logits)
    want = -np.mean([logp[b, t, targets[b, t]] for b in range(B) for t in range(T)])
    np.testing.assert_allclose(dq.models.token_nll(logits, targets), want, rtol=1e-12)


def test_lm_batches_passes_reset_and_restore():
    tokens = np.arange(100)
    it = dq.data.LMBatches(tokens, num_streams=2, segment_length=7)
    assert isinstance(it, dq.data.Batches) and it.steps_per_epoch == 7
    batches = [next(it) for _ in range(9)]
    assert [bool(b["reset"][0]) for b in batches] == [True] + [False] * 6 + [True, False]
    np.testing.assert_array_equal(batches[7]["inputs"], batches[0]["inputs"])  # a new pass
    np.testing.assert_array_equal(batches[1]["inputs"][1], np.arange(57, 64))  # stream 1
    np.testing.assert_array_equal(batches[1]["targets"], batches[1]["inputs"] + 1)
    assert it.state == dq.data.IteratorState(epoch=1, index=2)
    resumed = dq.data.LMBatches(tokens, num_streams=2, segment_length=7)
    resumed.restore(it.state._asdict())  # as after a checkpoint's JSON round trip
    for _ in range(8):
        a, b = next(it), next(resumed)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    # Process 1 of 2 takes the second stream.
    shard = dq.data.LMBatches(
        tokens, num_streams=2, segment_length=7, process_index=1, process_count=2
    )
    np.testing.assert_array_equal(next(shard)["inputs"], batches[0]["inputs"][1:])
    with pytest.raises(ValueError, match="divisible"):
        dq.data.LMBatches(tokens, num_streams=3, segment_length=7, process_index=0, process_count=2)
    with pytest.raises(ValueError, match="index"):
        it.restore({"epoch": 0, "index": 8})


def _lm(kind: str = "deq") -> hk.Transformed:
    def forward(tokens, mems, is_training):
        return dq.models.SequenceModel(
            20,
            kind,
            d_model=D,
            num_heads=2,
            depth=2,
            deq=dq.models.DEQSettings(
                dq.solvers.Anderson(max_steps=3, tol=1e-3, m=5),
                regularizer=dq.regularization.JacobianRegularizer(0.1, p=0.5),
            ),
        )(tokens, mems, is_training=is_training)

    return hk.transform(forward)


@pytest.mark.slow
def test_lm_loss_resets_memory_at_a_pass_start():
    model = _lm()
    loss_fn = dq.models.lm_loss(model, memory_length=M)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 20, (B, T)), jnp.int32)
    mem0 = dq.models.initial_memory("deq", batch_size=B, memory_length=M, d_model=D, depth=1)
    params = model.init(jax.random.PRNGKey(0), tokens, mem0, True)  # float32 like the embeddings
    key = jax.random.PRNGKey(1)
    batch = {"inputs": tokens, "targets": tokens, "reset": jnp.array([True, True])}
    junk = _normal(2, (B, M, D)).astype(jnp.float32)
    fn = jax.jit(lambda c, b: loss_fn(params, b, key, (), 0, carry=c))
    loss_reset, metrics, nxt = fn(junk, batch)
    loss_zero, _, _ = fn(jnp.zeros_like(junk), batch)
    np.testing.assert_allclose(loss_reset, loss_zero, rtol=1e-12)  # the junk memory is dropped
    loss_kept, _, _ = fn(junk, batch | {"reset": jnp.array([False, False])})
    assert abs(float(loss_kept) - float(loss_reset)) > 1e-6  # ... and used without a reset
    assert nxt.shape == (B, M, D) and set(metrics) >= {"nll", "nfe", "rel_residual", "jac_fro_sq"}


@pytest.mark.slow  # two fits with checkpoints (~20 s on a loaded 2-core machine)
def test_lm_fit_with_memory_resumes_exactly(tmp_path):
    """A run stopped after 3 steps and resumed reproduces the uninterrupted run: the memory
    (fit's carry) and the LMBatches position come back from the checkpoint."""
    model = _lm()
    tokens = np.random.default_rng(0).integers(0, 20, 200).astype(np.int32)
    mem0 = dq.models.initial_memory("deq", batch_size=B, memory_length=M, d_model=D, depth=1)
    first = next(dq.data.LMBatches(tokens, num_streams=B, segment_length=T))
    params = model.init(jax.random.PRNGKey(0), first["inputs"], mem0, True)

    pair = dq.training.train_step(
        dq.models.lm_loss(model, memory_length=M),
        dq.training.skip_nonfinite(optax.sgd(0.1)),
        with_carry=True,
    )
    parallel = dq.training.data_parallel("sharded")

    def fit(steps, out, resume=False):
        return dq.training.fit(
            pair,
            pair.init(params, jax.random.PRNGKey(1), carry=mem0),
            dq.data.LMBatches(tokens, num_streams=B, segment_length=T),
            num_steps=steps,
            parallel=parallel,
            actions=dq.training.default_actions(log_every=1, progress=False),
            checkpoints=dq.training.Checkpoints(out / "ckpt"),
            policy=dq.training.RunPolicy(resume=resume),
            writers=[dq.training.JsonlWriter(out / "m.jsonl")],
            say=None,
        )

    full = fit(6, tmp_path / "full")
    fit(3, tmp_path / "cut")
    resumed = fit(6, tmp_path / "cut", resume=True)
    assert resumed.restored_step == 3
    losses = lambda p: [r["loss"] for r in dq.training.read_jsonl(p) if r["split"] == "train"]  # noqa: E731
    assert losses(tmp_path / "cut" / "m.jsonl") == losses(tmp_path / "full" / "m.jsonl")
    np.testing.assert_array_equal(resumed.state.carry, full.state.carry)
    assert float(jnp.max(jnp.abs(full.state.carry))) > 0.1  # a real memory was carried
    for a, b in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(full.state.params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_evaluate_lm_carries_the_memory_across_segments():
    model = _lm()
    tokens = np.random.default_rng(0).integers(0, 20, 200).astype(np.int32)
    mem0 = dq.models.initial_memory("deq", batch_size=B, memory_length=M, d_model=D, depth=1)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((B, T), jnp.int32), mem0, True)
    kw = dict(num_streams=B, segment_length=T, num_segments=3)
    with_memory = dq.models.evaluate_lm(model, params, tokens, memory=mem0, **kw)
    without = dq.models.evaluate_lm(model, params, tokens, memory=None, **kw)
    assert with_memory["segments"] == without["segments"] == 3
    assert np.isfinite(with_memory["nll"]) and with_memory["nfe"] >= 1
    assert with_memory["nll"] != without["nll"]  # the carried memory reaches the predictions
