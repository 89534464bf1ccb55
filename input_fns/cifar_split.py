"""The CIFAR training split held in NumPy memory, and its augmented, standardized batches.

A training batch is, per image, a random crop of the image zero-padded by PAD
pixels, a random left-right flip, then per-image standardization (TF's official
CIFAR-10 ResNet recipe: `tf.image.per_image_standardization` of the padded crop).
Here that is one gather and one multiply-add per batch: the split is kept
zero-padded twice, as it is and mirrored left-right, so that every crop, flipped
or not, is a strided view of 32 rows of 96 contiguous bytes; and the mean and
standard deviation of every crop are computed once, when the split is loaded.
The TensorFlow ops this replaces (gather, crop_and_resize, per_image_standardization)
took five to seven times the CPU per batch, CPU the training step shares
(docs/speed.md).
"""
import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from estimator_dist.training import position, reader_priority

HEIGHT = WIDTH = 32
CHANNELS = 3
PAD = 4
OFFSETS = 2 * PAD + 1  # crop positions per axis: offset PAD is the image itself
PIXELS = HEIGHT * WIDTH * CHANNELS
# TensorFlow takes a NumPy result without copying it only if it is this aligned
# (EIGEN_MAX_ALIGN_BYTES, 64 with AVX-512); else a 3 MB copy per batch.
ALIGNMENT = 64
STATS_CHUNK = 4096  # images per step of crop_statistics (bounds its temporary memory)


class PaddedSplit:
    """uint8 images [N,32,32,3] and labels [N] held for augmented batches."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        n = len(labels)
        size = (HEIGHT + 2 * PAD, WIDTH + 2 * PAD)
        # [N, 2, 40, 40, 3]: each image zero-padded, then the same mirrored left-right.
        padded = np.zeros((n, 2) + size + (CHANNELS,), np.uint8)
        padded[:, 0, PAD:PAD + HEIGHT, PAD:PAD + WIDTH] = images
        padded[:, 1, PAD:PAD + HEIGHT, PAD:PAD + WIDTH] = images[:, :, ::-1]
        s_image, s_copy, s_row, s_col, _ = padded.strides
        # crops[i, m, y, x] = padded[i, m, y:y+32, x:x+32], rows of 96 contiguous bytes.
        self._crops = as_strided(padded, (n, 2, OFFSETS, OFFSETS, HEIGHT, WIDTH * CHANNELS),
                                 (s_image, s_copy, s_row, s_col, s_row, 1), writeable=False)
        self._padded = padded  # the view's memory
        self.labels = np.asarray(labels, np.int32)
        self.scale, self.offset = crop_statistics(images)

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, index, dy, dx, flip):
        """Standardized crops (float32 [B,32,32,3]) and labels (int32 [B]).

        index: examples of the split; dy, dx: where the crop starts in the padded
        image, 0..2*PAD (PAD: unshifted); flip: which crops to mirror left-right.
        """
        flip = np.asarray(flip, np.intp)
        # The mirrored copy of a crop starting at column dx starts at 2*PAD - dx.
        column = np.where(flip, 2 * PAD - dx, dx)
        pixels = self._crops[index, flip, dy, column].reshape(len(index), PIXELS)
        images = aligned_empty((len(index), PIXELS), np.float32)
        np.multiply(pixels, self.scale[index, dy, dx][:, None], out=images)
        images += self.offset[index, dy, dx][:, None]
        return images.reshape(len(index), HEIGHT, WIDTH, CHANNELS), self.labels[index]


def aligned_empty(shape, dtype, alignment=ALIGNMENT):
    """np.empty whose data starts on an `alignment`-byte boundary."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + size].view(dtype).reshape(shape)


def crop_statistics(images: np.ndarray):
    """(scale, offset), float32 [N, OFFSETS, OFFSETS]: standardized = pixel * scale + offset
    for the crop at each offset of each zero-padded image.

    As tf.image.per_image_standardization: mean and standard deviation over the
    crop's 3,072 values (padding zeros included), the deviation at least
    1/sqrt(3072). The sums are exact integers (at most 255^2 * 3,072 < 2^31).
    """
    n = len(images)
    scale = np.empty((n, OFFSETS, OFFSETS), np.float32)
    offset = np.empty_like(scale)
    squares = np.arange(256, dtype=np.int32) ** 2
    for start in range(0, n, STATS_CHUNK):
        chunk = images[start:start + STATS_CHUNK].reshape(-1, HEIGHT, WIDTH * CHANNELS)
        total = crop_sums(chunk.astype(np.int32))
        total_sq = crop_sums(squares[chunk])
        mean = total / PIXELS
        std = np.sqrt(np.maximum(total_sq / PIXELS - mean * mean, 0.0))
        std = np.maximum(std, 1.0 / np.sqrt(PIXELS))
        scale[start:start + STATS_CHUNK] = 1.0 / std
        offset[start:start + STATS_CHUNK] = -mean / std
    return scale, offset


class Batches:
    """Training batch number k of a split, a pure function of (seed, k).

    The examples of batch k are positions k*B .. k*B+B-1 of the endless sequence of
    epochs, each epoch a new permutation of the split (a full shuffle, not a buffer's;
    a batch may span two epochs); the crops and flips are drawn from a generator
    seeded with (seed, k). So any thread may make any batch, and a seeded run draws
    the same batches. Each call first lowers its thread's priority to `nice`.
    """

    def __init__(self, split: PaddedSplit, batch_size: int, seed: int, nice: int = 0):
        if not len(split):
            raise ValueError("an empty split has no batches")
        self.split, self.batch_size, self.seed, self.nice = split, batch_size, seed, nice
        self._epochs = {}
        self._lock = threading.Lock()

    def __call__(self, k):
        return self.slice(k, 0, self.batch_size)

    def slice(self, k, lo, size):
        """Examples lo .. lo+size-1 of batch k: one replica's share (training/position.py).

        The crops and flips are drawn for the whole batch, then sliced: a slice is the
        same whatever the number of slices.
        """
        reader_priority.lower_this_thread(self.nice)
        k, lo, size = int(k), int(lo), int(size)
        rng = np.random.default_rng([self.seed, k])
        dy, dx = rng.integers(0, OFFSETS, (2, self.batch_size))
        flip = rng.random(self.batch_size) < 0.5
        part = slice(lo, lo + size)
        return self.split.batch(self.indices(k)[part], dy[part], dx[part], flip[part])

    def indices(self, k):
        n = len(self.split)
        start = k * self.batch_size
        first, last = start // n, (start + self.batch_size - 1) // n
        order = np.concatenate([self.epoch(e) for e in range(first, last + 1)])
        return order[start - first * n:start - first * n + self.batch_size]

    def epoch(self, e):
        """The permutation of epoch e (the last few are kept: batches run in parallel)."""
        with self._lock:
            order = self._epochs.get(e)
            if order is None:
                order = position.epoch_order(len(self.split), self.seed, e)
                self._epochs = {k: v for k, v in self._epochs.items() if k >= e - 1}
                self._epochs[e] = order
            return order


# Crop offset k covers image lines k-PAD .. k-PAD+31, clipped to 0..31.
_LOW = np.clip(np.arange(OFFSETS) - PAD, 0, HEIGHT)
_HIGH = np.clip(np.arange(OFFSETS) - PAD + HEIGHT, 0, HEIGHT)


def crop_sums(values):
    """int32 [c, 32, 96] (rows of RGB values) -> [c, OFFSETS, OFFSETS] sums over each padded
    crop (summed-area tables: one cumulative sum down the rows, one along them)."""
    rows = np.zeros((len(values), HEIGHT + 1, WIDTH * CHANNELS), np.int32)
    np.cumsum(values, axis=1, out=rows[:, 1:])
    rows = rows[:, _HIGH] - rows[:, _LOW]  # [c, OFFSETS, 96]
    columns = np.zeros((len(values), OFFSETS, WIDTH * CHANNELS + 1), np.int32)
    np.cumsum(rows, axis=2, out=columns[:, :, 1:])
    return columns[:, :, _HIGH * CHANNELS] - columns[:, :, _LOW * CHANNELS]
