"""psd.torch pipelines: PipelineStage with ScheduleGPipe and Schedule1F1B,
each stage a thread of this process with its own client, against real
psd shards. Two stages of four micro-batches train what one unsplit
model trains, to float rounding, and the two schedules give the same
bits; three stages hold min(P - s, M) micro-batches' activations under
1F1B and M under GPipe; fewer micro-batches than stages train; a stage
that goes is named by its neighbour; wrong arguments are refused."""
import socket

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import psd
import psd.torch
from conftest import in_threads

STEPS = 50
BATCH = 32


def model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(),
                         nn.Linear(12, 5))


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(STEPS, BATCH, 20, generator=g)
    y = torch.randint(0, 5, (STEPS, BATCH), generator=g)
    return x, y


def half(whole, s, client, eps, **kw):
    """Stage s of 2 of the model: layers [0, 2) or [2, 5)."""
    return psd.torch.PipelineStage(whole[[0, 2][s]:[2, 5][s]], s, 2, client=client,
                                   endpoints=eps, **kw)


def free_endpoints(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    eps = ["tcp://127.0.0.1:%d" % s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return eps


def unsplit(servers):
    m = model()
    with psd.Client(servers, 0, 1) as c:
        opt = psd.torch.DistributedOptimizer(m, "momentum", lr=0.05, momentum=0.9, client=c)
        x, y = data()
        for i in range(STEPS):
            opt.zero_grad()
            F.cross_entropy(m(x[i]), y[i]).backward()
            opt.step()
        opt.close()
    return {k: v.clone() for k, v in m.state_dict().items()}


def pipelined(servers, schedule, m_micro, cuts=(2,), steps=STEPS):
    """One pipeline of len(cuts) + 1 stages (threads) over the model;
    its weights (the stages' state_dicts together) and each stage's
    most activations held."""
    whole = model()
    bounds = [0] + list(cuts) + [len(whole)]
    p = len(bounds) - 1
    eps = free_endpoints(p)
    x, y = data()

    def run(s):
        sub = whole[bounds[s]:bounds[s + 1]]
        with psd.Client(servers, s, p) as c:
            st = psd.torch.PipelineStage(sub, s, p, client=c, endpoints=eps)
            sched = schedule(st, m_micro, loss_fn=F.cross_entropy)
            opt = psd.torch.DistributedOptimizer(st, "momentum", lr=0.05, momentum=0.9)
            for i in range(steps):
                opt.zero_grad()
                if st.is_first:
                    sched.step(x[i])
                elif st.is_last:
                    sched.step(target=y[i])
                else:
                    sched.step()
                opt.step()
            opt.close()
            st.close()
            return st.activations_held_max

    held = in_threads(run, p)
    return {k: v.clone() for k, v in whole.state_dict().items()}, held


def test_two_stages_equal_the_unsplit_model_and_schedules_agree(cluster):
    base = unsplit(cluster.start(1, ["--workers", "1", "--consistency", "bsp"]))
    gp, _ = pipelined(cluster.start(1, ["--workers", "2", "--consistency", "bsp"]),
                      psd.torch.ScheduleGPipe, 4)
    fb, _ = pipelined(cluster.start(1, ["--workers", "2", "--consistency", "bsp"]),
                      psd.torch.Schedule1F1B, 4)
    assert sorted(gp) == sorted(base)
    for k in base:
        assert torch.equal(gp[k], fb[k]), "%s: GPipe and 1F1B differ" % k
        rel = float((gp[k] - base[k]).abs().max() / base[k].abs().max())
        assert rel <= 1e-5, "%s: %.2e relative to the unsplit model after %d steps" % (
            k, rel, STEPS)
    assert any(not torch.equal(base[k], model().state_dict()[k]) for k in base)  # it trained


@pytest.mark.parametrize("schedule,m,want", [(psd.torch.Schedule1F1B, 4, [3, 2, 1]),
                                             (psd.torch.ScheduleGPipe, 4, [4, 4, 4]),
                                             (psd.torch.Schedule1F1B, 2, [2, 2, 1])])
def test_three_stages_hold_what_the_schedule_says(cluster, schedule, m, want):
    servers = cluster.start(1, ["--workers", "3", "--consistency", "bsp"])
    _, held = pipelined(servers, schedule, m, cuts=(2, 4), steps=3)
    assert held == want


def test_a_stage_that_goes_is_named(cluster):
    servers = cluster.start(1, ["--workers", "2", "--consistency", "bsp"])
    eps = free_endpoints(2)
    whole = model()
    x, y = data()

    def run(s):
        with psd.Client(servers, s, 2) as c:
            st = half(whole, s, c, eps, stage_timeout_ms=500)
            sched = psd.torch.Schedule1F1B(st, 2, loss_fn=F.cross_entropy)
            if s == 1:  # takes one step's first activations, then goes
                st._recv(0, 0, 0, False)
                st.close()
                return None
            with pytest.raises(psd.ConnectionError) as e:
                sched.step(x[0])
                sched.step(x[1])
            st.close()
            return str(e.value)

    said = in_threads(run, 2)[0]
    assert "stage 1" in said and "is gone" in said


def test_wrong_arguments_are_refused(cluster):
    servers = cluster.start(1, ["--workers", "2"])
    eps = free_endpoints(2)
    with psd.Client(servers, 1, 2) as c:
        sub = model()[2:]
        with pytest.raises(ValueError, match="rank 1 runs stage 1 of 2"):
            psd.torch.PipelineStage(sub, 0, 2, client=c, endpoints=eps)
        with pytest.raises(ValueError, match="endpoints: 3 given; workers=2"):
            psd.torch.PipelineStage(sub, 1, 2, client=c, endpoints=eps + eps[:1])
        with pytest.raises(ValueError, match="num_stages: 2 or more"):
            psd.torch.PipelineStage(sub, 0, 1, client=c, endpoints=eps)
        st = psd.torch.PipelineStage(sub, 1, 2, client=c, endpoints=eps)
        with pytest.raises(ValueError, match="loss_fn: the last stage"):
            psd.torch.ScheduleGPipe(st, 4)
        with pytest.raises(ValueError, match="n_microbatches: 1 to 1024"):
            psd.torch.ScheduleGPipe(st, 0, loss_fn=F.cross_entropy)
        with pytest.raises(ValueError, match="accum_steps: a pipeline stage"):
            psd.torch.DistributedOptimizer(st, "sgd", accum_steps=2)
        st.close()


def test_curve_between_stages(cluster):
    """Stages that share a key pair train with CURVE between them; a
    stage whose pair is another is refused in the handshake, and its
    neighbour's wait says so."""
    zmq = pytest.importorskip("zmq")
    pair = tuple(k.decode() for k in zmq.curve_keypair())
    other = tuple(k.decode() for k in zmq.curve_keypair())
    servers = cluster.start(1, ["--workers", "2", "--consistency", "bsp"])
    eps = free_endpoints(2)
    whole = model()
    x, y = data()

    def run(s):
        with psd.Client(servers, s, 2) as c:
            st = half(whole, s, c, eps, curve_keypair=pair)
            sched = psd.torch.ScheduleGPipe(st, 2, loss_fn=F.cross_entropy)
            out = sched.step(x[0]) if s == 0 else sched.step(target=y[0])
            st.close()
            return out

    out = in_threads(run, 2)
    assert out[1] is not None and out[1].shape == (BATCH, 5)

    eps = free_endpoints(2)
    with psd.Link(1, 2, listen=eps[1], curve_keypair=pair) as b, \
            psd.Link(0, 2, next=eps[1], curve_keypair=other) as a:
        for _ in range(10):  # one thread plays both: the handshake needs b's handler
            with pytest.raises(psd.TimeoutError):
                b.wait_connected(50)
            with pytest.raises(psd.TimeoutError) as e:
                a.wait_connected(50)
        assert "handshake failed" in str(e.value)
