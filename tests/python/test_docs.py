"""Every public name of the psd package and of psd.torch, and every public
method and property of their classes, has a docstring: help() and an
editor show each one what it does."""
import inspect

import psd
import psd.torch


def public(mod):
    """(qualified name, object) of what mod itself defines for users."""
    names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
    for n in names:
        obj = getattr(mod, n)
        if inspect.ismodule(obj) or not getattr(obj, "__module__", "").startswith("psd"):
            continue
        yield "%s.%s" % (mod.__name__, n), obj
        if inspect.isclass(obj):
            for m, v in vars(obj).items():
                if not m.startswith("_") and (callable(v) or isinstance(v, property)):
                    yield "%s.%s.%s" % (mod.__name__, n, m), v


def test_every_public_name_has_a_docstring():
    names = list(public(psd)) + list(public(psd.torch))
    assert len(names) > 40, "too few names found: %s" % [n for n, _ in names]
    missing = [n for n, obj in names if not inspect.getdoc(obj)]
    assert not missing, "no docstring: %s" % ", ".join(missing)
