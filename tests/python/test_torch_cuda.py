"""psd.torch with the model on a GPU: the parameters stay on the device,
gradients leave through page-locked host buffers and the new weights come
back the same way. Skipped where torch sees no CUDA device (tests/gpu/check.sh
runs them on a GPU host)."""
import pytest
import torch

import psd  # noqa: E402
import psd.torch  # noqa: E402
from test_torch import STEPS, assert_same, data, model, psd_sgd, scaled_loop

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="torch sees no CUDA device")


@pytest.fixture(autouse=True)
def exact_float32():
    """TF32 off: float32 products on the GPU round as on the CPU, so the
    CPU run is a reference within float32's noise."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def on(batches, dev):
    return [(x.to(dev), y.to(dev)) for x, y in batches]


def test_cuda_parameters_train_as_cpu_ones(cluster):
    servers = cluster.start(shards=2, args=["--consistency", "bsp"])
    x, y = data(16 * STEPS)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]
    with psd.Client(servers) as c:
        cpu, _, cpu_losses = psd_sgd(model(), batches, c, prefix="cpu.", bucket_bytes=1)
        gpu, opt, gpu_losses = psd_sgd(model().cuda(), on(batches, "cuda"), c, prefix="gpu.",
                                       bucket_bytes=1)
        assert opt.steps == STEPS
        assert all(p.is_cuda for p in gpu.parameters())
        assert all(not t.is_cuda and t.is_pinned() for t in opt._send + opt._recv)
    assert gpu_losses[-1] < gpu_losses[0]
    # cuDNN's convolution sums in another order than the CPU's
    assert_same(gpu.cpu(), cpu, rtol=1e-3, atol=1e-4)


def f16():
    return torch.autocast("cuda", dtype=torch.float16)


def torch_scaler():
    """PyTorch's own GradScaler with the settings the test gives psd's."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cuda", init_scale=2.0 ** 12, growth_interval=4)
    return torch.cuda.amp.GradScaler(init_scale=2.0 ** 12, growth_interval=4)


def test_grad_scaler_with_f16_autocast_on_cuda_matches_torch(cluster):
    """The scales step as torch's GradScaler's do, the overflowing step is
    skipped, and the weights end where torch's local loop ends."""
    servers = cluster.start(args=["--consistency", "bsp"])
    x, y = data(32 * 12, seed=5)
    batches = on([(x[i:i + 32], y[i:i + 32]) for i in range(0, len(x), 32)], "cuda")
    got, ref = model().cuda(), model().cuda()
    with psd.Client(servers) as c:
        scaler = psd.torch.GradScaler(init_scale=2.0 ** 12, growth_interval=4)
        opt = psd.torch.DistributedOptimizer(got, "momentum", client=c, lr=0.05, momentum=0.9,
                                             scaler=scaler)
        scales, losses = scaled_loop(got, batches, scaler, opt, poison_at=5, autocast=f16)
    ref_scales, _ = scaled_loop(ref, batches, torch_scaler(),
                                torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9),
                                poison_at=5, autocast=f16)
    assert opt.skipped == 1 and opt.steps == 11
    assert scales == ref_scales
    assert scales[5] == scales[4] / 2
    assert losses[-1] < losses[0]
    # psd's step runs on the server's CPU, torch's on the GPU: their float32
    # roundings differ, and f16 forward passes can widen that a little
    assert_same(got.cpu(), ref.cpu(), rtol=1e-2, atol=1e-3)
