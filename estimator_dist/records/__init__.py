"""TFRecord files: the ImageNet layout and writing an image folder into it."""
