"""Data: idx, CIFAR-10, WikiText, text and TFDS sources, offline stand-ins, tokenization, batching.

>>> from deqjax import data
>>> train = data.load_fashion_mnist(split="train")        # {"image": uint8[60000,28,28], "label"}
>>> it = data.ShuffledBatches(train, batch_size=256, seed=0)  # this host's shard of each batch
>>> batch = next(it); it.state                            # IteratorState(epoch=0, index=1)
"""

from deqjax._src.data.augment import random_crop_flip
from deqjax._src.data.batching import (
    BatchIterator,
    IteratorState,
    ShuffledBatches,
    epoch_permutation,
    eval_batches,
    state_dict,
)
from deqjax._src.data.cache import default_cache_dir
from deqjax._src.data.cifar10 import CIFAR10_CLASSES, load_cifar10, read_cifar10_batch
from deqjax._src.data.classification import CLASSIFICATION_SETS, load_classification
from deqjax._src.data.copy_memory import (
    CopyMemoryBatches,
    CopyMemoryState,
    copy_memory_batch,
    copy_memory_blank_loss,
    copy_memory_steps_to_learn,
)
from deqjax._src.data.digits import load_digits
from deqjax._src.data.errors import DataFormatError, DataNotFoundError
from deqjax._src.data.idx import (
    DEFAULT_FASHION_MNIST_DIR,
    find_idx_files,
    load_fashion_mnist,
    load_idx_dataset,
    load_mnist,
    read_idx,
    write_idx,
)
from deqjax._src.data.kjv import load_kjv
from deqjax._src.data.lm_batching import (
    LMBatches,
    LMBatchesState,
    LMSegment,
    lm_segments,
    num_lm_segments,
    stream_layout,
)
from deqjax._src.data.sources import (
    STANDIN_PREFIX,
    ImageDataset,
    load_image_dataset,
    load_lm_corpus,
    pad_to_cifar_shape,
)
from deqjax._src.data.text import LMCorpus, load_text_corpus, split_lines
from deqjax._src.data.tfds_source import TFDSSplit, load_tfds_split, network_available
from deqjax._src.data.tokenizer import SentencePieceTokenizer, encode_corpus, train_sentencepiece
from deqjax._src.data.wikitext import load_wikitext

__all__ = [
    "BatchIterator",
    "CIFAR10_CLASSES",
    "CopyMemoryBatches",
    "CopyMemoryState",
    "CLASSIFICATION_SETS",
    "DEFAULT_FASHION_MNIST_DIR",
    "DataFormatError",
    "DataNotFoundError",
    "ImageDataset",
    "LMBatches",
    "LMBatchesState",
    "LMCorpus",
    "LMSegment",
    "STANDIN_PREFIX",
    "SentencePieceTokenizer",
    "TFDSSplit",
    "copy_memory_batch",
    "copy_memory_blank_loss",
    "copy_memory_steps_to_learn",
    "default_cache_dir",
    "encode_corpus",
    "load_cifar10",
    "load_classification",
    "load_image_dataset",
    "load_kjv",
    "load_lm_corpus",
    "load_text_corpus",
    "load_tfds_split",
    "load_wikitext",
    "lm_segments",
    "network_available",
    "num_lm_segments",
    "pad_to_cifar_shape",
    "random_crop_flip",
    "read_cifar10_batch",
    "split_lines",
    "state_dict",
    "stream_layout",
    "train_sentencepiece",
    "IteratorState",
    "ShuffledBatches",
    "epoch_permutation",
    "eval_batches",
    "find_idx_files",
    "load_digits",
    "load_fashion_mnist",
    "load_idx_dataset",
    "load_mnist",
    "read_idx",
    "write_idx",
]
