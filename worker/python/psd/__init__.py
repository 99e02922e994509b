"""psd: train through a psd parameter server from Python.

    import psd
    with psd.Client("tcp://127.0.0.1:5555,tcp://127.0.0.1:5556") as c:
        c.create_table("w", 1000, optimizer="momentum", lr=0.1)
        w = numpy.zeros(1000, numpy.float32)
        c.pull("w", w).wait()
        c.push("w", grad).wait()

The package is Python over libpsclient (ctypes); it finds the library
at PSD_LIBPSCLIENT, beside itself (the wheel carries one), in a build
tree next to its source, or through the loader. It is typed (py.typed).
worker/README.md ("Python") documents it."""
from .client import Client, Handle, Mirror, TopK, library
from .link import Link
from .errors import (AuthError, BusyError, ConnectionError, DeviceError, Error,
                     InvalidArgumentError, LimitError, NoTableError, NotPrimaryError,
                     NotSupportedError, OutOfMemoryError, ProtocolError, RemoteError,
                     SharedMemoryError, StateError, TableExistsError, TimeoutError)
from .safetensors import load_safetensors, save_safetensors

__all__ = ["Client", "Handle", "Mirror", "TopK", "Link", "library", "Error", "TimeoutError", "InvalidArgumentError",
           "TableExistsError", "NoTableError", "LimitError", "BusyError", "AuthError",
           "StateError", "ConnectionError", "OutOfMemoryError", "ProtocolError", "RemoteError",
           "NotSupportedError", "DeviceError", "SharedMemoryError", "NotPrimaryError",
           "load_safetensors", "save_safetensors"]
