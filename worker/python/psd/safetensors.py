"""The safetensors format psctl export and psworker --save write: an 8-byte
little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the data."""
from __future__ import annotations

import json
import os
import struct
from typing import Any, Mapping

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
           "I32": np.int32, "U8": np.uint8, "U64": np.uint64}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}
_HEADER_MAX = 100 << 20


def load_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """{name: numpy array} from a safetensors file (metadata is left out).
    ValueError names what is wrong with a malformed file."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("%s: shorter than a safetensors header" % path)
        (n,) = struct.unpack("<Q", raw)
        if n > _HEADER_MAX:
            raise ValueError("%s: a header of %d bytes is past the %d this reader takes"
                             % (path, n, _HEADER_MAX))
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError("%s: the header is not JSON (%s)" % (path, e)) from None
        data = f.read()
    out: dict[str, np.ndarray] = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = np.dtype(_DTYPES[t["dtype"]])
            shape = tuple(int(d) for d in t["shape"])
            a, b = (int(x) for x in t["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("%s: tensor %r has no valid dtype, shape and data_offsets"
                             % (path, name)) from None
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= a <= b <= len(data) or b - a != count * dtype.itemsize:
            raise ValueError("%s: tensor %r: bytes [%d, %d) do not hold %s of %s within the %d "
                             "bytes of data" % (path, name, a, b, shape, dtype, len(data)))
        out[name] = np.frombuffer(data, dtype=dtype, count=count, offset=a).reshape(shape).copy()
    return out


def save_safetensors(path: str | os.PathLike[str], tensors: Mapping[str, Any],
                     metadata: Mapping[str, object] | None = None) -> None:
    """Writes {name: array or CPU tensor} as a safetensors file."""
    arrays: list[np.ndarray] = []
    header: dict[str, Any] = {}
    off = 0
    for name, a in tensors.items():
        if type(a).__module__.startswith("torch"):
            a = a.detach().cpu().numpy()
        a = np.ascontiguousarray(a)
        if a.dtype not in _NAMES:
            raise TypeError("tensor %r: dtype %s is not one safetensors takes here"
                            % (name, a.dtype))
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        arrays.append(a)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for a in arrays:
            f.write(a.tobytes())
