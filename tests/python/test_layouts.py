"""The ctypes structures of the psd package against libpsclient's own
layouts: the members' names, order and byte offsets and the struct's
size, as the ABI baseline (worker/client/libpsclient.abi.xml, written by
abidw from the library's debug info and kept equal to the built library
by the abi test) records them. A member added to psclient.h and not to
psd/_lib.py, or the other way round, fails here by name."""
import ctypes
import os
import xml.etree.ElementTree as ET

import pytest

from psd import _lib

BASELINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "worker",
                        "client", "libpsclient.abi.xml")
# every struct the package passes to the library
MIRRORS = [_lib.Config, _lib.Vote, _lib.TableSpec, _lib.LinkConfig, _lib.Tensor]


def c_layouts():
    """{struct name: (bytes, [(member, byte offset), ...])} from the baseline."""
    out = {}
    for decl in ET.parse(BASELINE).getroot().iter("class-decl"):
        members = decl.findall("data-member")
        name = decl.get("name")
        if not name or not name.startswith("psc_") or not members:
            continue
        out[name] = (int(decl.get("size-in-bits")) // 8,
                     [(m.find("var-decl").get("name"), int(m.get("layout-offset-in-bits")) // 8)
                      for m in members])
    return out


@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.__name__)
def test_the_ctypes_structure_is_the_c_one(mirror):
    struct = mirror.__doc__.split()[1]  # "struct psc_config"
    layouts = c_layouts()
    assert struct in layouts, "%s is not in %s" % (struct, BASELINE)
    size, members = layouts[struct]
    ours = [(name, getattr(mirror, name).offset) for name, *_ in mirror._fields_]
    assert ours == members, "%s: the package has %s, the library %s" % (struct, ours, members)
    assert ctypes.sizeof(mirror) == size


def test_the_baseline_is_read():
    """The parser finds the structs at all (a changed format would make the
    test above pass on nothing)."""
    layouts = c_layouts()
    assert {"psc_config", "psc_table_spec", "psc_vote", "psc_link_config",
            "psc_tensor"} <= set(layouts)
    assert all(members for _, members in layouts.values())
