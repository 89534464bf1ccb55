"""The feature spec of the `tfrecord` input: which features a user's records hold.

Two spellings of one spec:
- text, for --set record_features=...: comma-separated `name[=record key]:dtype[:shape]`,
  e.g. `image=image/encoded:jpeg:64x64x3,label=image/class/label:int64,tags:int64:var`;
- YAML (the model's hparams in a --config file, or DATA_DIR/features.yaml), a mapping
  `{name: {key: record key, dtype: ..., shape: [..] or var}}`.
dtype: int64, float32, string, or jpeg (JPEG bytes decoded to float32 pixels 0-255,
resized to its shape [height, width, channels]). shape: absent or [] for a scalar,
`var` for a variable-length list (padded per batch), else fixed dimensions.
"""
import re
from dataclasses import dataclass
from typing import Optional, Tuple

from estimator_dist.errors import UserError

DTYPES = ("int64", "float32", "string", "jpeg")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
EXAMPLE = "image=image/encoded:jpeg:64x64x3,label=image/class/label:int64"


@dataclass(frozen=True)
class Feature:
    name: str  # the features dict key (and serving input name)
    key: str  # the tf.Example key
    dtype: str
    shape: Optional[Tuple[int, ...]]  # None: variable-length

    @property
    def serving(self):
        """[shape without batch, dtype name], as serving_features holds it."""
        if self.dtype == "jpeg":
            return [list(self.shape), "float32"]
        return [[None] if self.shape is None else list(self.shape), self.dtype]


def _error(spec, what) -> UserError:
    return UserError(f"record_features {spec!r:.120}: {what}; e.g. --set "
                     f"record_features={EXAMPLE} (see docs/imagenet.md)")


def _shape(spec, name, raw):
    if raw in (None, "", [], "scalar"):
        return ()
    if raw == "var":
        return None
    parts = raw if isinstance(raw, (list, tuple)) else str(raw).split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise _error(spec, f"feature '{name}' has shape {raw!r}; give positive dimensions "
                           f"(4, 2x3, [2, 3]), var for a variable-length list, or none")
    return dims


def _feature(spec, name, key, dtype, shape):
    if not isinstance(name, str) or not NAME.match(name):
        raise _error(spec, f"feature name {name!r} is not an identifier (letters, digits, _); "
                           f"read a record key such as image/encoded with name=key")
    if dtype not in DTYPES:
        raise _error(spec, f"feature '{name}' has dtype {dtype!r}, not one of {', '.join(DTYPES)}")
    shape = _shape(spec, name, shape)
    if dtype == "jpeg" and (shape is None or len(shape) not in (2, 3) or
                            (len(shape) == 3 and shape[2] not in (1, 3))):
        raise _error(spec, f"jpeg feature '{name}' needs its image shape HxWx3 (or HxWx1, HxW)")
    if dtype == "jpeg" and len(shape) == 2:
        shape = shape + (3,)
    return Feature(name, str(key or name), dtype, shape)


def parse_spec(spec):
    """{name: Feature} from the text or mapping spelling; UserError naming what is wrong."""
    features = []
    if isinstance(spec, str):
        for item in filter(None, (p.strip() for p in spec.split(","))):
            parts = item.split(":")
            if len(parts) not in (2, 3):
                raise _error(spec, f"'{item}' is not name[=key]:dtype[:shape]")
            name, _, key = parts[0].partition("=")
            features.append(_feature(spec, name.strip(), key.strip(), parts[1].strip(),
                                     parts[2].strip() if len(parts) == 3 else None))
    elif isinstance(spec, dict):
        for name, entry in spec.items():
            entry = {"dtype": entry} if isinstance(entry, str) else entry
            if not isinstance(entry, dict):
                raise _error(spec, f"feature '{name}' must map to {{key, dtype, shape}}")
            unknown = sorted(set(entry) - {"key", "dtype", "shape"})
            if unknown:
                raise _error(spec, f"feature '{name}' has unknown field(s) "
                                   f"{', '.join(map(str, unknown))}; allowed: key, dtype, shape")
            features.append(_feature(spec, name, entry.get("key"), entry.get("dtype"),
                                     entry.get("shape")))
    else:
        raise _error(spec, "must be text or a mapping")
    if not features:
        raise _error(spec, "names no feature")
    names = [f.name for f in features]
    if len(set(names)) != len(names):
        raise _error(spec, "names a feature twice")
    return {f.name: f for f in features}
