"""``deqjax.data`` exports the loaders, iterators, tokenizer and errors users need, and no more.

Growing the public API is a deliberate edit of this list.
"""

from deqjax import data

PUBLIC = {
    "BatchIterator",
    "CopyMemoryBatches",
    "DataFormatError",
    "DataNotFoundError",
    "ImageDataset",
    "IteratorState",
    "LMBatches",
    "LMCorpus",
    "SentencePieceTokenizer",
    "ShuffledBatches",
    "copy_memory_batch",
    "copy_memory_blank_loss",
    "copy_memory_steps_to_learn",
    "encode_corpus",
    "load_classification",
    "load_digits",
    "load_fashion_mnist",
    "load_image_dataset",
    "load_lm_corpus",
    "random_crop_flip",
    "train_sentencepiece",
}


def test_data_exports_exactly_the_public_names():
    assert len(data.__all__) == len(set(data.__all__)) and set(data.__all__) == PUBLIC
    for name in data.__all__:
        assert getattr(data, name) is not None
