"""`predict --input` on image files: a JPEG or PNG file, or a folder of them (subfolders too).

Each image reaches the model as its eval images did: stored as `tfrecords` stores it (an
RGB JPEG as is, any other image re-encoded as RGB JPEG, records/image_folder.jpeg_of), then
prepared by the input's own eval code: `imagenet`'s central 87.5% crop and resize
(input_fns/imagenet_preprocessing.eval_image), the `tfrecord` input's decode and resize of a
jpeg feature (input_fns/tfrecord.decoded). Which one, and the size, is what the run's input
said in its metadata (`image_files`, saved in MODEL_DIR/config.yaml): an input that says
nothing there does not read image files, and predict refuses them instead of guessing.
"""
import os
from typing import Dict, Iterator, List, Tuple

import numpy as np

from estimator_dist.errors import UserError

SUFFIXES = (".jpg", ".jpeg", ".png")
# input_meta key: how the input prepares an image file's JPEG bytes for the model.
META_KEY = "image_files"
PREPARATIONS = ("imagenet_eval", "resize")
FILE_COLUMN = "file"  # predict's first output column: the image file of the row


def is_image_input(path: str) -> bool:
    """A folder, or a file named .jpg/.jpeg/.png (any case)."""
    return os.path.isdir(path) or path.lower().endswith(SUFFIXES)


def image_paths(path: str) -> List[str]:
    """The image files `path` names: itself, or a folder's (subfolders too), sorted; hidden
    files and folders are skipped."""
    if not os.path.isdir(path):
        if not os.path.isfile(path):
            raise UserError(f"--input {path}: no such file")
        return [path]
    found = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(root, n) for n in sorted(names)
                  if not n.startswith(".") and n.lower().endswith(SUFFIXES)]
    if not found:
        raise UserError(f"--input {path}: a folder with no {', '.join(SUFFIXES)} file in it or "
                        f"its subfolders; give image files, or a .csv or .npy file")
    return found


def preparation(model_dir: str, saved_model: str, specs) -> Dict:
    """The image_files metadata of the run that exported `saved_model`, checked against the
    SavedModel's inputs `specs`."""
    from estimator_dist import config_yaml as config_lib

    config_path = os.path.join(model_dir, config_lib.CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise UserError(f"--saved_model {saved_model}: image files are prepared as the model's "
                        f"input prepared its eval images, which the run's config.yaml says, and "
                        f"{config_path} does not exist; give --saved_model MODEL_DIR (or an "
                        f"export under MODEL_DIR/export) of a run written by estimator-dist train")
    saved = config_lib.load_saved(model_dir)
    resolved = saved.get("resolved") or {}
    meta = (resolved.get("input_meta") or {}).get(META_KEY)
    input_name = resolved.get("input") or (saved.get("data") or {}).get("input") or "?"
    if not isinstance(meta, dict) or meta.get("preparation") not in PREPARATIONS:
        raise UserError(f"input '{input_name}' of {model_dir} does not read image files (its "
                        f"metadata has no {META_KEY}); give --input a .csv or .npy of its "
                        f"features ({', '.join(specs)})")
    feature, shape = meta.get("feature"), [int(d) for d in meta.get("shape") or ()]
    if set(specs) != {feature}:
        raise UserError(f"--saved_model {saved_model} takes {', '.join(sorted(specs))}; image "
                        f"files feed only a model whose one input is the image '{feature}'; "
                        f"give a .csv with those columns")
    served = [d for d in specs[feature].shape[1:]]
    if served != shape:
        raise UserError(f"--saved_model {saved_model}: input '{feature}' is {served}, but "
                        f"{config_path} says input '{input_name}' made images of {shape}; give "
                        f"the SavedModel exported from that run")
    return {"feature": feature, "preparation": meta["preparation"], "shape": shape}


def model_pixels(jpeg: bytes, prep: Dict) -> np.ndarray:
    """float32 pixels [height, width, channels] 0-255, as the input's eval code makes them."""
    import tensorflow as tf

    height, width, channels = prep["shape"]
    if prep["preparation"] == "imagenet_eval":
        from input_fns import imagenet_preprocessing

        return imagenet_preprocessing.eval_image(tf.constant(jpeg), height).numpy()
    from input_fns import tfrecord
    from input_fns.tfrecord_spec import Feature

    feature = Feature(prep["feature"], prep["feature"], "jpeg", (height, width, channels))
    return tfrecord.decoded(feature, tf.constant(jpeg)).numpy()


def batches(paths: List[str], prep: Dict, batch_size: int) -> Iterator[Dict[str, np.ndarray]]:
    """{feature: pixels [batch, ...]} for `paths` in order, batch_size images at a time."""
    from estimator_dist.records import image_folder

    for start in range(0, len(paths), batch_size):
        pixels = [model_pixels(image_folder.jpeg_of(p)[0], prep)
                  for p in paths[start:start + batch_size]]
        yield {prep["feature"]: np.stack(pixels)}


def image_batches(saved_model: str, model_dir: str, specs, input_path: str,
                  batch_size: int) -> Tuple[List[str], Iterator[Dict[str, np.ndarray]]]:
    """(the image files of input_path, their model inputs batch by batch); refuses before any
    image is read when the model's input does not read image files."""
    paths = image_paths(input_path)
    prep = preparation(model_dir, saved_model, specs)
    return paths, batches(paths, prep, batch_size)
