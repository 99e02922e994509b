"""psd.Error and its kinds: a failed call raises one, with the PS_E* code,
its name, and the sentence the library or the server wrote. Every code
has a kind; the codes are common/protocol/ps_errcodes.h's (they travel
on the wire, so their values never change: new ones are appended), and
tests/python/test_errors.py checks this list against that header and
the library."""
from __future__ import annotations

import builtins

PS_EINVAL = -1
PS_ENOMEM = -2
PS_EPROTO = -3
PS_EVERSION = -4
PS_EOP = -5
PS_EFRAMES = -6
PS_ESIZE = -7
PS_ERANGE = -8
PS_ENOTABLE = -9
PS_EEXIST = -10
PS_ELIMIT = -11
PS_ETIMEDOUT = -12
PS_EAGAIN = -13
PS_EBUSY = -14
PS_EIO = -15
PS_EZMQ = -16
PS_EDTYPE = -17
PS_ECLOSED = -18
PS_ESTATE = -19
PS_EREMOTE = -20
PS_ENOTSUP = -21
PS_ENODEV = -22
PS_EDEVICE = -23
PS_ESHM = -24
PS_EAUTH = -25
PS_ENOTPRIMARY = -26

# name -> code, every PS_E* above
CODES: dict[str, int] = {k: v for k, v in globals().items() if k.startswith("PS_E")}


class Error(Exception):
    """A call to psd failed. code: the negative PS_E* code; name: its name
    ("PS_ETIMEDOUT"); message: what went wrong, the server's own sentence
    where a server refused."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__("%s: %s" % (name, message))
        self.code = code
        self.name = name
        self.message = message


class TimeoutError(Error, builtins.TimeoutError):
    """No answer within the timeout (PS_ETIMEDOUT)."""


class InvalidArgumentError(Error, ValueError):
    """A server or the library refused an argument (PS_EINVAL, PS_ERANGE, PS_EDTYPE)."""


class TableExistsError(Error):
    """A table of that name exists with a different spec (PS_EEXIST)."""


class NoTableError(Error, KeyError):
    """No such table (PS_ENOTABLE)."""


class LimitError(Error):
    """A bound was reached: tables, rows, bytes, waits (PS_ELIMIT)."""


class BusyError(Error):
    """Another connection holds this worker id, or the resource is in use (PS_EBUSY)."""


class AuthError(Error, PermissionError):
    """Refused by the servers' security (PS_EAUTH)."""


class StateError(Error):
    """Not now: the round or the table is in the wrong state (PS_ESTATE, PS_EAGAIN)."""


class ConnectionError(Error, builtins.ConnectionError):
    """The transport failed or was closed (PS_EZMQ, PS_ECLOSED, PS_EIO)."""


class OutOfMemoryError(Error, MemoryError):
    """The library or a server could not allocate what the call needed (PS_ENOMEM)."""


class ProtocolError(Error):
    """A message was malformed, or of a version, operation or shape the other
    side does not speak (PS_EPROTO, PS_EVERSION, PS_EOP, PS_EFRAMES, PS_ESIZE)."""


class RemoteError(Error):
    """A server refused with a code of its own that has no kind here (PS_EREMOTE)."""


class NotSupportedError(Error, NotImplementedError):
    """Not supported by this build or this server (PS_ENOTSUP)."""


class DeviceError(Error):
    """A compute device is missing or failed (PS_ENODEV, PS_EDEVICE)."""


class SharedMemoryError(Error):
    """No shared-memory region with the shard, or no room in it (PS_ESHM)."""


class NotPrimaryError(ConnectionError):
    """The shard asked is a backup, not its primary: the client looks for the
    primary and asks again, and raises this only when none answers
    (PS_ENOTPRIMARY)."""


_KINDS: dict[str, type[Error]] = {
    "PS_ETIMEDOUT": TimeoutError,
    "PS_EINVAL": InvalidArgumentError,
    "PS_ERANGE": InvalidArgumentError,
    "PS_EDTYPE": InvalidArgumentError,
    "PS_EEXIST": TableExistsError,
    "PS_ENOTABLE": NoTableError,
    "PS_ELIMIT": LimitError,
    "PS_EBUSY": BusyError,
    "PS_EAUTH": AuthError,
    "PS_ESTATE": StateError,
    "PS_EAGAIN": StateError,
    "PS_EZMQ": ConnectionError,
    "PS_ECLOSED": ConnectionError,
    "PS_EIO": ConnectionError,
    "PS_ENOMEM": OutOfMemoryError,
    "PS_EPROTO": ProtocolError,
    "PS_EVERSION": ProtocolError,
    "PS_EOP": ProtocolError,
    "PS_EFRAMES": ProtocolError,
    "PS_ESIZE": ProtocolError,
    "PS_EREMOTE": RemoteError,
    "PS_ENOTSUP": NotSupportedError,
    "PS_ENODEV": DeviceError,
    "PS_EDEVICE": DeviceError,
    "PS_ESHM": SharedMemoryError,
    "PS_ENOTPRIMARY": NotPrimaryError,
}


def error(code: int, name: str, message: str) -> Error:
    """The Error of the kind code names."""
    return _KINDS.get(name, Error)(code, name, message)
