"""psworker's convolution and pooling kernels (the CPU backend, through
tests/tools/psk_layers) against torch.nn.functional on odd sizes: the
forward output and every gradient. And the mixed-precision rounding
against torch's own casts to bfloat16 and float16, bit for bit.

Tolerance: relative error (the norm of the difference over the norm of
torch's) at most 1e-5 for the convolution, whose sums run in another
order than torch's, and exact equality for pooling, which only picks or
averages the same floats."""
import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

CONV_TOL = 1e-5


def tool():
    t = os.environ.get("PSK_LAYERS_BIN")
    if not t:
        pytest.skip("PSK_LAYERS_BIN is not set (run through meson test)")
    return t


def run(args, tmp, arrays, device="cpu"):
    for name, a in arrays.items():
        np.ascontiguousarray(a, np.float32).tofile(os.path.join(tmp, name))
    r = subprocess.run([tool()] + [args[0], str(tmp)] + [str(a) for a in args[1:]] + [device],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return lambda name, shape: np.fromfile(os.path.join(tmp, name), np.float32).reshape(shape)


def rel(got, want):
    want = want.detach().numpy() if hasattr(want, "detach") else want
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


@pytest.mark.parametrize("n,c_in,h,w,c_out,k,pad", [
    (3, 1, 7, 9, 5, 3, 0),    # odd everything, one input channel
    (2, 3, 5, 5, 4, 3, 1),    # padded: the output keeps the size
    (1, 2, 6, 4, 3, 1, 0),    # a 1x1 kernel
    (4, 5, 11, 13, 7, 5, 2),  # a 5x5 kernel, padding 2
    (2, 32, 13, 13, 64, 3, 0),  # the CNN's second convolution
])
def test_conv_matches_torch(tmp_path, n, c_in, h, w, c_out, k, pad):
    g = np.random.default_rng(n * 1000 + c_in * 100 + k)
    x = torch.tensor(g.standard_normal((n, c_in, h, w)), dtype=torch.float32, requires_grad=True)
    wt = torch.tensor(g.standard_normal((c_out, c_in, k, k)), dtype=torch.float32,
                      requires_grad=True)
    b = torch.tensor(g.standard_normal(c_out), dtype=torch.float32, requires_grad=True)
    y = F.conv2d(x, wt, b, padding=pad)
    dy = torch.tensor(g.standard_normal(y.shape), dtype=torch.float32)
    y.backward(dy)
    out = run(["conv", n, c_in, h, w, c_out, k, pad], tmp_path,
              {"x": x.detach(), "w": wt.detach(), "b": b.detach(), "dy": dy})
    errs = {"y": rel(out("y", y.shape), y), "gw": rel(out("gw", wt.shape), wt.grad),
            "gb": rel(out("gb", b.shape), b.grad), "dx": rel(out("dx", x.shape), x.grad)}
    print("conv", (n, c_in, h, w, c_out, k, pad), errs)
    assert all(e <= CONV_TOL for e in errs.values()), errs


@pytest.mark.parametrize("kind", ["maxpool", "avgpool"])
@pytest.mark.parametrize("n,c,h,w,s", [
    (2, 3, 7, 9, 2),   # windows that do not fit are dropped
    (1, 4, 6, 6, 3),
    (3, 1, 5, 5, 1),   # a 1x1 window: the identity
    (2, 64, 11, 11, 2),  # the CNN's second pool
])
def test_pool_matches_torch(tmp_path, kind, n, c, h, w, s):
    g = np.random.default_rng(n * 100 + c * 10 + s)
    x = torch.tensor(g.standard_normal((n, c, h, w)), dtype=torch.float32, requires_grad=True)
    y = (F.max_pool2d if kind == "maxpool" else F.avg_pool2d)(x, s)
    dy = torch.tensor(g.standard_normal(y.shape), dtype=torch.float32)
    y.backward(dy)
    out = run([kind, n, c, h, w, s], tmp_path, {"x": x.detach(), "dy": dy})
    np.testing.assert_array_equal(out("y", y.shape), y.detach().numpy())
    if kind == "maxpool":
        np.testing.assert_array_equal(out("dx", x.shape), x.grad.numpy())
    else:  # torch multiplies by 1/(s*s), the kernel divides: one rounding apart
        np.testing.assert_allclose(out("dx", x.shape), x.grad.numpy(), rtol=1e-6, atol=0)


def test_bad_shapes_are_refused(tmp_path):
    np.zeros(2 * 2, np.float32).tofile(tmp_path / "x")
    r = subprocess.run([tool(), "maxpool", str(tmp_path), "1", "1", "2", "2", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "a 3x3 window does not fit 2x2" in r.stderr
    r = subprocess.run([tool(), "conv", str(tmp_path), "1", "1", "2", "2", "1", "5", "0"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "has no output" in r.stderr


def special_values():
    """Random floats over the whole range, and the edges where rounding
    differs: ties, the largest halves, subnormals, infinities, NaN."""
    g = np.random.default_rng(7)
    bits = g.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    v = [bits.view(np.float32),
         g.standard_normal(5000).astype(np.float32) * np.float32(1e4),
         g.standard_normal(5000).astype(np.float32) * np.float32(1e-6)]
    edges = [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 65536.0, 1e6, 3.4e38,
             6.1035156e-05, 6.1e-05, 5.96e-08, 2.98e-08, 2.99e-08, 1e-10,
             1.0 + 2.0**-8, 1.0 + 3 * 2.0**-9, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-12,
             np.inf, -np.inf, np.nan]
    v.append(np.array(edges + [-e for e in edges], np.float32))
    return np.concatenate(v)


@pytest.mark.parametrize("prec,dtype", [("bf16", torch.bfloat16), ("f16", torch.float16)])
def test_rounding_matches_torch_casts(tmp_path, prec, dtype):
    x = special_values()
    with np.errstate(invalid="ignore"):
        out = run(["round", x.size, prec], tmp_path, {"x": x})
    got = out("y", x.shape)
    want = torch.from_numpy(x).to(dtype).float().numpy()
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    # bit for bit, the sign of zero included
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert out("count", (1,))[0] == np.count_nonzero(~np.isfinite(want))


def test_unknown_precision_is_refused(tmp_path):
    np.zeros(4, np.float32).tofile(tmp_path / "x")
    r = subprocess.run([tool(), "round", str(tmp_path), "4", "f8"], capture_output=True, text=True)
    assert r.returncode == 2 and "'f8' is not bf16 or f16" in r.stderr
