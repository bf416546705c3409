"""The activation-peak model of plans (systems/ssdtrain/planning.py): the per-layer peaks a kept
step's trace measures, checked on a meter whose every byte the test decides, the prediction worked
out by hand, and on a GPU against the allocator's peak of steps run under the plans."""

import dataclasses
import itertools
import math

import pytest
import torch
from torch import nn

from harness.errors import UserError
from systems.ssdtrain import HostStore, Offloader, offload, planning
from systems.ssdtrain.planning import KEEP, OFFLOAD, RECOMPUTE, LayerProfile


class Meter:
    """Bytes that the test's layers allocate and free, with a peak since the last reset."""

    def __init__(self, start: int = 1000):
        self.now = self.top = start

    def allocated(self) -> int:
        return self.now

    def peak(self) -> int:
        return self.top

    def reset(self) -> None:
        self.top = self.now

    def change(self, nbytes: int) -> None:
        self.now += nbytes
        self.top = max(self.top, self.now)


class Charged(torch.autograd.Function):
    """Doubles its input; charges the meter a transient and the bytes it keeps in forward, and a
    transient in backward, after which what it kept is freed."""

    @staticmethod
    def forward(ctx, x, meter, transient, kept, backward_transient):
        meter.change(transient)
        meter.change(kept - transient)
        ctx.save_for_backward(x)
        ctx.meter, ctx.kept, ctx.backward_transient = meter, kept, backward_transient
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors  # the unpack tells the trace that backward reached the layer
        ctx.meter.change(ctx.backward_transient)
        ctx.meter.change(-ctx.backward_transient - ctx.kept)
        return grad * 2 + 0 * x, None, None, None, None


class Layer(nn.Module):
    def __init__(self, meter, transient, kept, backward_transient):
        super().__init__()
        self.meter, self.charges = meter, (transient, kept, backward_transient)

    def forward(self, x):
        return Charged.apply(x, self.meter, *self.charges)


class Head(torch.autograd.Function):
    """The loss: saves its input outside the layers; its backward charges the logits' gradient
    (and, given ``replay``, runs it with gradients on, as a recomputation in backward would)."""

    @staticmethod
    def forward(ctx, x, meter, backward_transient, replay):
        ctx.save_for_backward(x)
        ctx.meter, ctx.backward_transient, ctx.replay = meter, backward_transient, replay
        return x.square().sum()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        ctx.meter.change(ctx.backward_transient)
        ctx.meter.change(-ctx.backward_transient)
        if ctx.replay is not None:
            with torch.enable_grad():
                ctx.replay(x.detach().requires_grad_())
            ctx.meter.change(-ctx.replay.charges[1])  # what the replay kept, dropped unused
        return 2 * x * grad, None, None, None


class Charging(nn.Module):
    def __init__(self, meter, charges, head, replay: int | None = None, repeat: int | None = None):
        super().__init__()
        self.meter, self.head, self.replay, self.repeat = meter, head, replay, repeat
        self.layers = nn.ModuleList(Layer(meter, *c) for c in charges)
        self.weight = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i == self.repeat:
                x = layer(x)
        replay = None if self.replay is None else self.layers[self.replay]
        return Head.apply(x * self.weight, self.meter, self.head, replay)


# Per layer: forward transient, bytes kept, backward transient.
CHARGES = [(300, 100, 50), (40, 200, 500), (10, 400, 20)]
HEAD = 650


def traced(model, meter, x, with_model_hook=False):
    layers = list(model.layers)
    trace = planning.PeakTrace(layers, meter, model if with_model_hook else None)
    counter = Offloader(model, HostStore(), policy="keep", layers=layers, min_bytes=0, keep_last=0)
    counter.backward_listeners.append(trace.backward_reached)
    trace.start()
    with counter:
        model(x).backward()
    trace.stop()
    trace.remove()
    return trace


def test_the_trace_puts_each_peak_in_its_layer_s_forward_or_backward():
    meter = Meter()
    model = Charging(meter, CHARGES, HEAD)
    trace = traced(model, meter, torch.randn(7, generator=torch.Generator().manual_seed(1), requires_grad=True))
    # Forward k: what the layers below keep, then its transient or its own kept bytes.
    assert trace.forward == {0: 300, 1: 100 + 200, 2: 300 + 400}
    # The head's backward, before the top layer's (the first backward reaches): everything kept
    # and the logits' gradient.
    assert (trace.head, trace.head_layer) == (700 + HEAD, 2)
    # Backward i: what layers 0..i keep plus its transient.
    assert trace.backward == {2: 700 + 20, 1: 300 + 500, 0: 100 + 50}
    assert trace.measured and meter.now == 1000  # everything charged was freed


def test_a_forward_run_inside_backward_is_backward_s():
    """The head's backward runs layer 0's forward with gradients on (as a recomputation does): its
    300 B transient is the head's, not a forward of layer 0."""
    meter = Meter()
    model = Charging(meter, CHARGES, HEAD, replay=0)
    trace = traced(model, meter, torch.randn(4, requires_grad=True))
    assert trace.forward == {0: 300, 1: 300, 2: 700}
    assert (trace.head, trace.head_layer) == (700 + HEAD, 2) and trace.backward == {2: 720, 1: 800, 0: 150}


def test_a_layer_run_twice_in_a_step_leaves_the_trace_unmeasured():
    """Layer 1 runs twice in forward: backward cannot tell its two calls apart, so the trace gives no
    peaks (a profile then has none) rather than booking one call's backward to another layer."""
    meter = Meter()
    model = Charging(meter, CHARGES, HEAD, repeat=1)
    trace = traced(model, meter, torch.randn(4, requires_grad=True))
    assert not trace.measured


def test_the_trace_ends_with_the_step_s_first_backward():
    """What runs after backward (the optimizer's first step allocates its state) and a second
    backward are not the profiled step's."""
    meter = Meter()
    model = Charging(meter, CHARGES, HEAD)
    layers = list(model.layers)
    trace = planning.PeakTrace(layers, meter)
    counter = Offloader(model, HostStore(), policy="keep", layers=layers, min_bytes=0, keep_last=0)
    counter.backward_listeners.append(trace.backward_reached)
    trace.start()
    with counter:
        model(torch.randn(4, requires_grad=True)).backward()
        assert trace.measured  # stopped as backward ended
        meter.change(5000)
        model(torch.randn(4, requires_grad=True)).backward()
    trace.stop()
    assert trace.backward == {2: 720, 1: 800, 0: 150} and trace.forward == {0: 300, 1: 300, 2: 700}


def test_the_trace_measures_from_the_model_s_forward_when_given_the_model():
    """A step that frees 60 B (gradients set to None) before the model's forward: its peaks are
    above what the forward started with, not above what the step started with."""
    meter = Meter()
    model = Charging(meter, CHARGES, HEAD)
    trace = planning.PeakTrace(list(model.layers), meter, model)
    counter = Offloader(model, HostStore(), policy="keep", layers=list(model.layers), min_bytes=0, keep_last=0)
    counter.backward_listeners.append(trace.backward_reached)
    trace.start()
    meter.change(-60)
    with counter:
        model(torch.randn(3, requires_grad=True)).backward()
    trace.stop()
    trace.remove()
    assert trace.forward[2] == 700 and trace.head == 700 + HEAD


# The trace of CHARGES as profiles: saved bytes, input bytes, forward seconds and peaks.
PROFILES = [
    LayerProfile(100, 10, 1.0, forward_peak=300, backward_peak=150),
    LayerProfile(200, 20, 1.0, forward_peak=300, backward_peak=800),
    LayerProfile(400, 40, 1.0, forward_peak=700, backward_peak=720, head_peak=1350),
]


def test_keep_predicts_the_largest_measured_peak():
    plan = planning.predict(PROFILES, [KEEP] * 3, 1e12, 1.0)
    assert plan.predicted_peak_bytes == 1350


def test_a_plan_s_peak_is_keep_s_less_what_the_layers_below_hold_less():
    # Layer 0 recomputed holds its 10 B input instead of 100 B: every segment above it is 90 B lower.
    assert planning.predict(PROFILES, [RECOMPUTE, KEEP, KEEP], 1e12, 1.0).predicted_peak_bytes == 1350 - 90
    # Layers 0 and 1 recomputed: the top's backward holds 30 B of their 300.
    assert planning.predict(PROFILES, [RECOMPUTE, RECOMPUTE, KEEP], 1e12, 1.0).predicted_peak_bytes == 1350 - 270
    # Layer 1 offloaded at a bandwidth that writes it during its forward: the head's backward holds
    # 200 B less (1150); the top's backward reads it back in full (the layer below the running one:
    # 720) and layer 1's own backward is keep's (800). The head's segment stays the largest.
    assert planning.predict(PROFILES, [KEEP, OFFLOAD, KEEP], 1e12, 1.0).predicted_peak_bytes == 1350 - 200
    # Layer 0 offloaded: the head's and the top's backward hold 100 B less (1250, 620), layer 1's
    # backward reads it back (800).
    assert planning.predict(PROFILES, [OFFLOAD, KEEP, KEEP], 1e12, 1.0).predicted_peak_bytes == 1250
    # So at an infinite bandwidth: nothing is left unwritten when forward ends.
    infinite = planning.predict(PROFILES, [OFFLOAD, KEEP, KEEP], math.inf, 1.0)
    assert (infinite.predicted_peak_bytes, infinite.predicted_activation_bytes) == (1250, 600)


def test_an_offloaded_layer_s_unwritten_bytes_count_in_the_forward_above_it():
    """Four 1 s layers, the first two offloaded at 50 B/s. Layer 0's 100 B are written from 0 to
    2 s, layer 1's 200 B from 2 to 6 s; forward ends at 4 s with 100 B of layer 1 unwritten. Layer
    2's forward ends at 3 s, when 150 B of layer 1 are unwritten: 50 B more than at the end of
    forward, so its segment holds 200 - 50 B less than keep's (4850); layer 3's forward ends at
    4 s and holds 200 B less (3800)."""
    profiles = [
        LayerProfile(100, 10, 1.0, forward_peak=10, backward_peak=0),
        LayerProfile(200, 20, 1.0, forward_peak=10, backward_peak=0),
        LayerProfile(100, 10, 1.0, forward_peak=5000, backward_peak=0),
        LayerProfile(400, 40, 1.0, forward_peak=4000, backward_peak=0),
    ]
    plan = planning.predict(profiles, [OFFLOAD, OFFLOAD, KEEP, KEEP], 50.0, 1.0)
    assert plan.predicted_activation_bytes == 100 + 100 + 400
    assert plan.predicted_peak_bytes == 5000 - 200 + 50


def test_no_peak_is_predicted_from_a_profile_without_peaks():
    flat = [LayerProfile(p.saved_bytes, p.input_bytes, p.forward_seconds) for p in PROFILES]
    assert planning.predict(flat, [KEEP] * 3, 1e12, 1.0).predicted_peak_bytes is None
    # A layer that did not run (nothing saved, no time) has no peaks and needs none.
    idle = [*PROFILES, LayerProfile(0, 0, 0.0)]
    assert planning.predict(idle, [KEEP] * 4, 1e12, 1.0).predicted_peak_bytes == 1350


def test_profile_traces_the_peaks_where_the_device_has_a_meter(monkeypatch):
    """A CPU has no allocator statistics: no peaks. With a meter (a GPU's; here a fake one) the
    profile's measured step gives each layer its traced peaks, the head's to the top layer."""
    meter = Meter()
    model = Charging(meter, CHARGES, HEAD)
    x = torch.randn(5, requires_grad=True)
    profiles, _, _ = planning.profile(model, list(model.layers), lambda: model(x).backward(), "cpu")
    assert all(p.forward_peak is None and p.backward_peak is None and p.head_peak is None for p in profiles)
    monkeypatch.setattr(planning, "meter_for", lambda device: meter)
    profiles, _, _ = planning.profile(model, list(model.layers), lambda: model(x).backward(), "cpu")
    assert [(p.forward_peak, p.backward_peak, p.head_peak) for p in profiles] == [
        (300, 150, None),
        (300, 800, None),
        (700, 720, 1350),
    ]
    # A step without a backward measured nothing: no peaks, rather than backward peaks of 0.
    profiles, _, _ = planning.profile(model, list(model.layers), lambda: model(x), "cpu")
    assert all(p.forward_peak is None for p in profiles)


@pytest.mark.gpu
def test_gpu_predicted_peaks_meet_the_allocator_s_peak_of_the_planned_steps():
    """Every keep / offload / recompute plan of the tiny Llama on a batch of 32 sequences (host
    store): keep's predicted peak is the measured one, and every plan's within the planner's 10%."""
    from systems.ssdtrain import POLICIES
    from workloads.llm.data import batches
    from workloads.llm.layers import blocks
    from workloads.llm.models import build, spec

    s = spec("llama", "tiny")
    model = build(s, seed=0).model.cuda()
    batch = {k: v.repeat(32, *[1] * (v.dim() - 1)).cuda() for k, v in next(batches(s, seed=0)).items()}
    layers = [block for _, block in blocks(model)]

    def step():
        model.zero_grad(set_to_none=False)  # the gradients stay allocated: not activations
        model(**batch).loss.backward()

    profiles, _, fixed = planning.profile(model, layers, step, "cuda")
    assert all(p.forward_peak > 0 and p.backward_peak > p.saved_bytes for p in profiles)
    with HostStore() as store:
        for decisions in itertools.product((KEEP, OFFLOAD, RECOMPUTE), repeat=len(layers)):
            plan = planning.predict(profiles, decisions, 1e12, 1.0, fixed_bytes=fixed)
            policy = POLICIES["planner"].build(model, store=store, plan=plan, min_bytes=0, keep_last=0)
            peaks = []
            for _ in range(2):  # the first warms the plan's path (recomputation) up
                model.zero_grad(set_to_none=False)
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                with policy.step():
                    model(**batch).loss.backward()
                peaks.append(torch.cuda.max_memory_allocated() - before)
            policy.close()
            if decisions == (KEEP,) * len(layers):
                assert plan.predicted_peak_bytes == pytest.approx(peaks[-1], rel=0.02)
            assert plan.predicted_peak_bytes == pytest.approx(peaks[-1], rel=0.10), (decisions, peaks)


@pytest.mark.parametrize("entered", ["once", "per_step"])
def test_offload_s_planner_profiles_the_peaks_of_its_first_forward_and_backward_only(monkeypatch, entered):
    """offload()'s planner traces the peaks of its profiled step from the model's forward until the
    step's backward ends: what the loop allocates after backward (the optimizer's first step
    allocates its state) is not a block's backward peak. A fake meter stands in for the GPU's."""
    from systems.ssdtrain import offload

    meter = Meter()
    monkeypatch.setattr(planning, "meter_for", lambda device: meter)
    seen = []
    real_plan = planning.plan
    monkeypatch.setattr(
        planning, "plan", lambda profiles, *a, **k: seen.append(profiles) or real_plan(profiles, *a, **k)
    )
    model = Charging(meter, CHARGES, HEAD)
    x = torch.randn(7, generator=torch.Generator().manual_seed(2), requires_grad=True)
    options = dict(policy="planner", budget=0.5, layers=list(model.layers), min_bytes=0, bandwidth=1e9, keep_last=0)

    def step():
        model(x).backward()
        meter.change(5000)  # the optimizer's state, after backward

    with HostStore() as store:
        session = offload(model, store=store, **options)
        if entered == "once":
            with session:
                step()
                step()
        else:
            for _ in range(2):
                with session:
                    step()
    (profiles,) = seen
    assert [(p.forward_peak, p.backward_peak, p.head_peak) for p in profiles] == [
        (300, 150, None),
        (300, 800, None),
        (700, 720, 1350),
    ]
    predicted = planning.predict(profiles, session.plan.decisions, 1e9, 1.0).predicted_peak_bytes
    assert session.plan.predicted_peak_bytes == predicted and 0 < predicted <= 1350


@pytest.mark.gpu
def test_gpu_offload_s_planner_predicts_the_peak_of_the_steps_it_plans():
    """offload(policy="planner") on the tiny Llama (32 sequences) on the GPU: the plan it makes from
    its first step predicts the allocator's peak of the later steps within the planner's 10%."""
    from systems.ssdtrain import offload
    from workloads.llm.data import batches
    from workloads.llm.layers import blocks
    from workloads.llm.models import build, spec

    s = spec("llama", "tiny")
    model = build(s, seed=0).model.cuda()
    batch = {k: v.repeat(32, *[1] * (v.dim() - 1)).cuda() for k, v in next(batches(s, seed=0)).items()}
    layers = [block for _, block in blocks(model)]
    model(**batch).loss.backward()  # the gradients exist from here on, zeroed in place
    peaks = []
    options = dict(policy="planner", budget=0.5, layers=layers, min_bytes=0)
    with HostStore() as store, offload(model, store=store, **options) as session:
        for _ in range(3):
            model.zero_grad(set_to_none=False)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            model(**batch).loss.backward()
            peaks.append(torch.cuda.max_memory_allocated() - before)
    assert session.plan.predicted_peak_bytes == pytest.approx(peaks[-1], rel=0.10), (session.plan, peaks)


def test_a_stopped_trace_leaves_the_device_s_peak_statistics_alone():
    """Started, then stopped before the model's forward began (a profiled step that never came):
    the model's later forwards must not reset the user's peak statistics."""
    meter = Meter()
    model = Charging(meter, CHARGES, HEAD)
    trace = planning.PeakTrace(list(model.layers), meter, model)
    trace.start()
    trace.stop()
    resets = []
    meter.reset = lambda: resets.append(True)
    model(torch.randn(3, requires_grad=True)).backward()
    trace.remove()
    assert not resets and not trace.measured


def test_the_planner_keeps_within_a_peak_budget():
    """With a peak budget the planner takes the fastest plan whose predicted peak fits it (checked
    against every plan's prediction), and without a fitting one the lowest peak; a profile without
    peaks cannot be planned by peak."""
    everything = 10**9
    plans = [planning.predict(PROFILES, d, 100.0, 1.0) for d in itertools.product((KEEP, OFFLOAD, RECOMPUTE), repeat=3)]
    peaks = sorted({p.predicted_peak_bytes for p in plans})
    assert len(peaks) >= 4  # budgets that each leave other plans out
    for peak_budget in peaks:
        chosen = planning.plan(PROFILES, 100.0, 1.0, everything, keep_last=0, peak_budget_bytes=peak_budget)
        fitting = [p for p in plans if p.predicted_peak_bytes <= peak_budget]
        assert fitting and chosen.predicted_peak_bytes <= peak_budget
        assert chosen.predicted_seconds == min(p.predicted_seconds for p in fitting)
        assert chosen.peak_budget_bytes == peak_budget
    tightest = planning.plan(PROFILES, 100.0, 1.0, everything, keep_last=0, peak_budget_bytes=1)
    assert tightest.predicted_peak_bytes == min(p.predicted_peak_bytes for p in plans) > 1
    flat = [LayerProfile(p.saved_bytes, p.input_bytes, p.forward_seconds) for p in PROFILES]
    no_backward = [dataclasses.replace(p, backward_peak=None) if i == 1 else p for i, p in enumerate(PROFILES)]
    for lacking in (flat, no_backward):
        assert not planning.has_peaks(lacking)
        with pytest.raises(UserError, match="a peak budget needs a profile with the layers' peaks"):
            planning.plan(lacking, 100.0, 1.0, everything, peak_budget_bytes=1000)
    idle = LayerProfile(0, 0, 0.0)  # a block that did not run in the profiled step has no peaks to trace
    assert planning.has_peaks([*PROFILES, idle]) and not planning.has_peaks([idle])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"policy": "planner", "peak_budget": 1000}, "needs the model on a CUDA device"),
        ({"policy": "offload_all", "peak_budget": 1000}, "peak_budget= is the planner's"),
        ({"policy": "planner"}, "needs budget= .* or peak_budget="),
    ],
)
def test_offload_refuses_a_peak_budget_it_cannot_plan_for(options, message):
    model = Charging(Meter(), CHARGES, HEAD)
    with HostStore() as store, pytest.raises(UserError, match=message):
        offload(model, store=store, layers=list(model.layers), **options)


@pytest.mark.parametrize("peak_budget", [0, -5, 2.5, "1000", True])
def test_offload_refuses_a_peak_budget_that_is_not_bytes(monkeypatch, peak_budget):
    meter = Meter()
    monkeypatch.setattr(planning, "meter_for", lambda device: meter)
    model = Charging(meter, CHARGES, HEAD)
    with HostStore() as store, pytest.raises(UserError, match="peak_budget must be a positive whole number"):
        offload(model, store=store, policy="planner", layers=list(model.layers), peak_budget=peak_budget)


def test_offload_s_planner_fits_its_peak_budget(monkeypatch):
    """offload(peak_budget=...) plans the fastest plan whose predicted peak fits: the traced CHARGES
    peak at 1350 B under keep, and each layer saves a 28 B tensor that offloading frees, so 1330
    needs a block offloaded; a budget nothing fits warns and takes the lowest peak."""
    meter = Meter()
    monkeypatch.setattr(planning, "meter_for", lambda device: meter)
    model = Charging(meter, CHARGES, HEAD)
    x = torch.randn(7, requires_grad=True)
    options = dict(policy="planner", layers=list(model.layers), min_bytes=0, bandwidth=1e9, keep_last=0)
    with HostStore() as store:
        with offload(model, store=store, peak_budget=1330, **options) as session:
            model(x).backward()
            model(x).backward()
        assert session.plan.peak_budget_bytes == 1330 and session.plan.predicted_peak_bytes <= 1330
        assert session.plan.decisions != (KEEP,) * 3
        with pytest.warns(UserWarning, match="no plan fits peak_budget=1 B"):
            with offload(model, store=store, peak_budget=1, **options) as tight:
                model(x).backward()
                model(x).backward()
        assert tight.plan.predicted_peak_bytes > 1
