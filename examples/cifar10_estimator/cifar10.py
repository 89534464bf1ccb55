"""CIFAR-10 TFRecords as TensorFlow's cifar10_estimator tutorial reads them (cifar10.py there),
after tf_upgrade_v2, plus a writer of synthetic records in the same format.

A record holds `image` (3072 raw uint8 bytes, depth-major: 3 x 32 x 32) and `label` (int64);
the files are DATA_DIR/{train,validation,eval}.tfrecords.
"""
import os

import numpy as np
import tensorflow as tf

HEIGHT = 32
WIDTH = 32
DEPTH = 3
SUBSETS = ("train", "validation", "eval")


class Cifar10DataSet(object):
    """The tutorial's dataset: file names, the record parser, the batched dataset."""

    def __init__(self, data_dir, subset="train", use_distortion=True):
        self.data_dir = data_dir
        self.subset = subset
        self.use_distortion = use_distortion

    def get_filenames(self):
        if self.subset not in SUBSETS:
            raise ValueError("Invalid data subset \"%s\"" % self.subset)
        return [os.path.join(self.data_dir, self.subset + ".tfrecords")]

    def parser(self, serialized_example):
        """Parses a single tf.Example into image and label tensors."""
        features = tf.io.parse_single_example(
            serialized=serialized_example,
            features={
                "image": tf.io.FixedLenFeature([], tf.string),
                "label": tf.io.FixedLenFeature([], tf.int64),
            })
        image = tf.io.decode_raw(features["image"], tf.uint8)
        image.set_shape([DEPTH * HEIGHT * WIDTH])
        # Reshape from [depth * height * width] to [depth, height, width], then HWC.
        image = tf.cast(
            tf.transpose(a=tf.reshape(image, [DEPTH, HEIGHT, WIDTH]), perm=[1, 2, 0]),
            tf.float32)
        label = tf.cast(features["label"], tf.int32)
        image = self.preprocess(image)
        return image, label

    def make_dataset(self, batch_size, seed=None):
        """The tutorial's make_batch up to its iterator: repeat, parse, shuffle, batch."""
        dataset = tf.data.TFRecordDataset(self.get_filenames()).repeat()
        dataset = dataset.map(self.parser, num_parallel_calls=batch_size)
        if self.subset == "train":
            dataset = dataset.shuffle(buffer_size=64, seed=seed)
        return dataset.batch(batch_size)

    def make_batch(self, batch_size, seed=None):
        """The tutorial's own: tensors from a one-shot iterator, not a dataset."""
        iterator = tf.compat.v1.data.make_one_shot_iterator(
            self.make_dataset(batch_size, seed))
        return iterator.get_next()

    def preprocess(self, image):
        """Preprocess a single image in [height, width, depth] layout."""
        if self.subset == "train" and self.use_distortion:
            # Pad 4 pixels on each dimension of feature map, done in mini-batch
            image = tf.image.resize_with_crop_or_pad(image, 40, 40)
            image = tf.image.random_crop(image, [HEIGHT, WIDTH, DEPTH])
            image = tf.image.random_flip_left_right(image)
        return image


def write_synthetic(data_dir, examples=64, seed=0):
    """Synthetic CIFAR-10 records in the tutorial's format: `examples` per subset, the label
    readable from the image (its mean brightness), so a model can learn it."""
    rng = np.random.RandomState(seed)
    os.makedirs(data_dir, exist_ok=True)
    for subset in SUBSETS:
        path = os.path.join(data_dir, subset + ".tfrecords")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(examples):
                label = int(rng.randint(10))
                image = rng.randint(0, 64, size=DEPTH * HEIGHT * WIDTH) + 16 * label
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[image.astype(np.uint8).tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }))
                writer.write(example.SerializeToString())
    return data_dir


if __name__ == "__main__":
    import sys
    print(write_synthetic(sys.argv[1] if len(sys.argv) > 1 else "cifar10_data"))
