"""Data: loaders with their sources named, resumable batch iterators, tokenization, errors.

>>> from deqjax import data
>>> train = data.load_fashion_mnist(split="train")        # {"image": uint8[60000,28,28], "label"}
>>> it = data.ShuffledBatches(train, batch_size=256, seed=0)  # this host's shard of each batch
>>> batch = next(it); it.state                            # IteratorState(epoch=0, index=1)
"""

from deqjax._src.data.augment import random_crop_flip
from deqjax._src.data.batching import Batches, IteratorState, ShuffledBatches
from deqjax._src.data.classification import load_classification
from deqjax._src.data.copy_memory import (
    CopyMemoryBatches,
    copy_memory_batch,
    copy_memory_blank_loss,
    copy_memory_steps_to_learn,
)
from deqjax._src.data.digits import load_digits
from deqjax._src.data.errors import DataFormatError, DataNotFoundError
from deqjax._src.data.grain_batches import GrainBatches
from deqjax._src.data.grain_shuffled import grain_shuffled_batches, grain_shuffled_examples
from deqjax._src.data.idx import load_fashion_mnist
from deqjax._src.data.lm_batching import LMBatches
from deqjax._src.data.sources import ImageDataset, load_image_dataset, load_lm_corpus
from deqjax._src.data.text import LMCorpus
from deqjax._src.data.tokenizer import SentencePieceTokenizer, encode_corpus, train_sentencepiece

__all__ = [
    "Batches",
    "CopyMemoryBatches",
    "DataFormatError",
    "DataNotFoundError",
    "GrainBatches",
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
    "grain_shuffled_batches",
    "grain_shuffled_examples",
    "load_classification",
    "load_digits",
    "load_fashion_mnist",
    "load_image_dataset",
    "load_lm_corpus",
    "random_crop_flip",
    "train_sentencepiece",
]
