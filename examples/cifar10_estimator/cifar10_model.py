"""The tutorial's ResNetCifar10 (cifar10_model.py and model_base.py there), after
tf_upgrade_v2 and one hand edit: `tf.contrib.layers.batch_norm` became
`tf.compat.v1.layers.batch_normalization` (same decay/epsilon, fills UPDATE_OPS).

`width` scales the filters (16, 16, 32, 64 in the tutorial) so a test runs it on a CPU.
"""
import tensorflow as tf


class ResNetCifar10(object):
    """ResNet v1 for CIFAR-10: a conv, three stages of residual blocks, global pooling."""

    def __init__(self, num_layers, is_training, batch_norm_decay, batch_norm_epsilon,
                 width=16, data_format="channels_last"):
        self._batch_norm_decay = batch_norm_decay
        self._batch_norm_epsilon = batch_norm_epsilon
        self._is_training = is_training
        self._data_format = data_format
        self.n = (num_layers - 2) // 6
        self.filters = [width, width, 2 * width, 4 * width]
        self.strides = [1, 2, 2]

    def forward_pass(self, x, input_data_format="channels_last"):
        """Build the core model within the graph."""
        x = x / 128 - 1
        x = self._conv(x, 3, self.filters[0], 1)
        x = self._batch_norm(x)
        x = tf.nn.relu(x)
        for i in range(3):
            with tf.compat.v1.name_scope("stage"):
                for j in range(self.n):
                    stride = self.strides[i] if j == 0 else 1
                    x = self._residual_v1(x, 3, self.filters[i], self.filters[i + 1], stride)
        x = tf.reduce_mean(x, axis=[1, 2])
        return tf.compat.v1.layers.dense(x, 10)

    def _residual_v1(self, x, kernel_size, in_filter, out_filter, stride):
        orig_x = x
        with tf.compat.v1.name_scope("conv1"):
            x = self._conv(x, kernel_size, out_filter, stride)
            x = self._batch_norm(x)
            x = tf.nn.relu(x)
        with tf.compat.v1.name_scope("conv2"):
            x = self._conv(x, kernel_size, out_filter, 1)
            x = self._batch_norm(x)
        if in_filter != out_filter:
            orig_x = tf.compat.v1.layers.average_pooling2d(orig_x, stride, stride, "valid")
            pad = (out_filter - in_filter) // 2
            orig_x = tf.pad(tensor=orig_x, paddings=[[0, 0], [0, 0], [0, 0], [pad, pad]])
        return tf.nn.relu(tf.add(x, orig_x))

    def _conv(self, x, kernel_size, filters, strides):
        padding = "SAME"
        if strides > 1:
            pad = kernel_size - 1
            pad_beg = pad // 2
            x = tf.pad(tensor=x, paddings=[[0, 0], [pad_beg, pad - pad_beg],
                                           [pad_beg, pad - pad_beg], [0, 0]])
            padding = "VALID"
        return tf.compat.v1.layers.conv2d(x, filters, kernel_size, strides, padding,
                                          use_bias=False, data_format=self._data_format)

    def _batch_norm(self, x):
        # Was tf.contrib.layers.batch_norm(x, decay=..., center=True, scale=True,
        # epsilon=..., is_training=..., fused=True, data_format=...).
        return tf.compat.v1.layers.batch_normalization(
            x, momentum=self._batch_norm_decay, epsilon=self._batch_norm_epsilon,
            training=self._is_training, fused=True)
