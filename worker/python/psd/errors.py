"""psd.Error and its kinds: a failed call raises one, with the PS_E* code,
its name, and the sentence the library or the server wrote."""
import builtins


class Error(Exception):
    """A call to psd failed. code: the negative PS_E* code; name: its name
    ("PS_ETIMEDOUT"); message: what went wrong, the server's own sentence
    where a server refused."""

    def __init__(self, code, name, message):
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


_KINDS = {
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
}


def error(code, name, message):
    """The Error of the kind code names."""
    return _KINDS.get(name, Error)(code, name, message)
