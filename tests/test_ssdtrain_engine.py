"""SSDTrain's offloader: losses and every gradient bit-identical to training without it (an MLP
stack, a tiny GPT-2, a tiny Llama; every store and policy; three optimizer steps), deduplication,
parameters and small tensors never offloaded, prefetch, files gone after every step and after an
error, in-place modification of saved tensors caught, and on a GPU the same plus the memory saved."""

import contextlib
import errno
import gc
import logging
import os
import weakref
from concurrent.futures import Future

import pytest
import torch
import torch.nn.functional as F
import transformers
from test_ssdtrain_stores import real_disk_folder
from torch import nn

from harness.errors import UserError
from systems.ssdtrain import DirectFileStore, EmulatedStore, HostStore, Offloader, find_layers
from systems.ssdtrain.cache import storage_key

logging.getLogger("transformers").setLevel(logging.ERROR)  # tiny configs draw warnings about token ids
# Deterministic cuBLAS for the GPU tests (read when cuBLAS starts; tests are imported before any runs).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
STEPS = 3


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class MLPStack(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 4):
        super().__init__()
        self.inp = nn.Linear(16, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, 1)

    def forward(self, x, y):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return F.mse_loss(self.head(h), y)


# On a GPU, attention by plain matmuls: the fused kernels' backward adds with atomics, so two runs
# without any offloading already differ.
ATTENTION = {"cpu": "sdpa", "cuda": "eager"}


def gpt2(dropout: float = 0.1, attention: str = "sdpa"):
    config = transformers.GPT2Config(
        n_layer=3, n_embd=64, n_head=4, vocab_size=128, n_positions=32, use_cache=False,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, attn_implementation=attention,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def llama(attention: str = "sdpa"):
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=False, attn_implementation=attention,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def make_model(name: str, device="cpu"):
    """A seeded model and a function computing its loss on step ``i``'s seeded batch."""
    torch.manual_seed(0)
    if name == "mlp":
        model = MLPStack().to(device)

        def loss(i):
            g = torch.Generator().manual_seed(100 + i)
            x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
            return model(x.to(device), y.to(device))

    else:
        attention = ATTENTION[torch.device(device).type]
        model = (gpt2(attention=attention) if name == "gpt2" else llama(attention)).to(device)

        def loss(i):
            ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(100 + i)).to(device)
            torch.manual_seed(200 + i)  # the dropout masks
            return model(input_ids=ids, labels=ids).loss

    model.train()
    return model, loss


def train(name: str, offloader_args=None, device="cpu", after_step=None):
    """Losses and gradients of STEPS AdamW steps, with an Offloader built from ``offloader_args``
    (a function of the model) around each step's forward and backward, or without one."""
    model, loss_of = make_model(name, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    offloader = offloader_args(model) if offloader_args else None
    losses, grads = [], []
    for i in range(STEPS):
        optimizer.zero_grad()
        if offloader is None:
            loss = loss_of(i)
            loss.backward()
        else:
            with offloader:
                loss = loss_of(i)
                loss.backward()
            if after_step:
                after_step(offloader)
        losses.append(loss.detach().clone())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        optimizer.step()
    return losses, grads, offloader


def assert_identical(got, want):
    (losses, grads, _), (ref_losses, ref_grads, _) = got, want
    for step in range(STEPS):
        assert torch.equal(losses[step], ref_losses[step]), f"loss differs at step {step}"
        assert grads[step].keys() == ref_grads[step].keys()
        for name, grad in grads[step].items():
            assert torch.equal(grad, ref_grads[step][name]), f"gradient of {name} differs at step {step}"


@pytest.fixture
def disk(tmp_path):
    with real_disk_folder(tmp_path) as folder:
        yield folder


def make_store(kind, disk):
    return {
        "host": lambda: HostStore(),
        "direct_file": lambda: DirectFileStore(disk, threads=2, block_bytes=64 << 10),
        "emulated": lambda: EmulatedStore(20.0),
        # Writes slower than forward: backward meets puts still running (forwarding, late frees).
        "slow_file": lambda: EmulatedStore(0.05, inner=DirectFileStore(disk, threads=2, block_bytes=64 << 10)),
    }[kind]()


def every_other(layer: int) -> str:
    return "offload" if layer % 2 == 0 else "keep"


POLICIES = {
    "keep": dict(policy="keep"),
    "offload_all": dict(policy="offload_all"),
    "offload_all_keep_none": dict(policy="offload_all", keep_last=0),
    "every_other": dict(policy=every_other, keep_last=0),
}
_references = {}


def reference(name, device="cpu"):
    if (name, device) not in _references:
        _references[name, device] = train(name, device=device)
    return _references[name, device]


def check_step_left_nothing(offloader):
    assert len(offloader.cache) == 0 and len(offloader.store) == 0
    store = offloader.store.inner if isinstance(offloader.store, EmulatedStore) else offloader.store
    assert len(store) == 0
    if isinstance(store, DirectFileStore):
        assert list(store.directory.iterdir()) == []


# Every model, store and policy once in the fast tier; the whole cross-product in the full one.
FAST = {("llama", "slow_file", "every_other"), ("gpt2", "direct_file", "offload_all")}
FAST |= {("mlp", "emulated", "offload_all_keep_none"), ("mlp", "host", "keep")}
CASES = [
    pytest.param(name, store, policy, marks=() if (name, store, policy) in FAST else pytest.mark.full)
    for name in ("mlp", "gpt2", "llama")
    for store in ("host", "direct_file", "emulated", "slow_file")
    for policy in POLICIES
]


@pytest.mark.parametrize("name, store, policy", CASES)
def test_losses_and_gradients_are_bit_identical(name, store, policy, disk):
    with make_store(store, disk) as s:
        got = train(
            name, lambda m: Offloader(m, s, min_bytes=0, **POLICIES[policy]), after_step=check_step_left_nothing
        )
        stats = got[2].stats
    assert_identical(got, reference(name))
    total = stats.total
    if policy == "keep":
        assert total.offloaded_bytes == 0 and stats.store.tensors_stored == 0
    else:
        assert total.offloaded_bytes > 0
        assert stats.store.bytes_written == total.offloaded_bytes
        # Read back: all of it, but what backward needed before its write ended (served from memory).
        assert stats.store.bytes_read <= total.offloaded_bytes
        assert stats.store.bytes_read == total.offloaded_bytes or store != "host"
        assert stats.demand_loads == 0  # every read back was started ahead by prefetch
    assert total.unique_bytes == total.offloaded_bytes + total.parameter_bytes + total.kept_bytes
    assert total.parameter_bytes > 0


def test_dedup_stores_each_storage_once_and_restores_views_of_it():
    torch.manual_seed(0)
    model = gpt2(dropout=0.0)  # the attention then saves q, k and v: three views of one tensor
    ids = torch.randint(0, 128, (2, 32))
    reference_grads = None
    for use_offloader in (False, True):
        model.zero_grad()
        if not use_offloader:
            model(input_ids=ids, labels=ids).loss.backward()
            reference_grads = [p.grad.clone() for p in model.parameters()]
            continue
        offloader = Offloader(model, HostStore(), min_bytes=0, keep_last=0)
        restored = []
        unpack = offloader.cache.unpack
        offloader.cache.unpack = lambda handle: restored.append(unpack(handle)) or restored[-1]
        with offloader:
            model(input_ids=ids, labels=ids).loss.backward()
        stats = offloader.stats.total
        assert stats.unique_tensors < stats.packed_tensors
        assert offloader.stats.store.tensors_stored == stats.offloaded_tensors < len(restored)
        storages = {t.untyped_storage().data_ptr() for t in restored}
        assert len(storages) == stats.offloaded_tensors  # views share their one restored storage
        assert any(not t.is_contiguous() for t in restored)  # q, k, v come back as the views they were
        restored.clear()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), reference_grads))


def test_a_reused_address_is_a_different_storage():
    """A storage freed, then a new one at the same address (here made so on purpose: both over one
    buffer): the key tells them apart while the first one's weak reference is held."""
    memory = bytearray(4096)
    a = torch.frombuffer(memory, dtype=torch.float32)
    key, ref = storage_key(a)
    del a
    assert ref.expired()
    b = torch.frombuffer(memory, dtype=torch.float32)
    assert storage_key(b)[0].data_ptr == key.data_ptr and storage_key(b)[0] != key


class UnsafeGates(nn.Module):
    """Two gates cut from one product by ``unsafe_chunk`` and squashed in place, one after the
    other (a GRU cell's gates on the CPU): the pieces share a storage, not a version counter."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * dim)

    def forward(self, x):
        update, reset = self.proj(x).unsafe_chunk(2, dim=1)
        return x + torch.sigmoid_(update) * torch.tanh_(reset)


@pytest.mark.parametrize("block", ["unsafe_chunk", "gru"])
def test_pieces_of_one_storage_changed_in_place_one_after_another_each_come_back_as_saved(block):
    """The second piece was squashed after the first was saved and put: served from the first
    one's entry it came back unsquashed (gradients off by up to 0.1)."""

    def run(with_offloader: bool):
        torch.manual_seed(0)
        if block == "gru":
            blocks = nn.ModuleList(nn.GRUCell(12, 12) for _ in range(3))
        else:
            blocks = nn.ModuleList(UnsafeGates(12) for _ in range(3))
        x = torch.randn(5, 12, generator=torch.Generator().manual_seed(1))
        with Offloader(blocks, HostStore(), min_bytes=0, keep_last=0) if with_offloader else contextlib.nullcontext():
            h = x
            for layer in blocks:
                h = layer(h) if block == "unsafe_chunk" else layer(x, h)
            h.square().mean().backward()
        return [p.grad for p in blocks.parameters()]

    plain, offloaded = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded))


@pytest.mark.parametrize("inplace", [False, True])
def test_a_buffer_its_op_fills_after_saving_it_is_stored_filled(inplace):
    """RReLU in training saves its noise buffer, then draws into it without a version change: a
    put started at the save stored unwritten bytes (gradients inf or garbage)."""

    def run(with_offloader: bool):
        torch.manual_seed(0)
        blocks = nn.Sequential(*(nn.Sequential(nn.Linear(12, 12), nn.RReLU(inplace=inplace)) for _ in range(3)))
        x = torch.randn(5, 12, generator=torch.Generator().manual_seed(1))
        with Offloader(blocks, HostStore(), min_bytes=0, keep_last=0) if with_offloader else contextlib.nullcontext():
            torch.manual_seed(2)  # the noise
            blocks(x).square().mean().backward()
        return [p.grad for p in blocks.parameters()]

    plain, offloaded = run(False), run(True)
    assert all(torch.isfinite(g).all() for g in plain)
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded))


class FreshTensors(nn.Module):
    """Saves tensors made one after another, each freed (once offloaded) before the next is made."""

    def __init__(self, addresses: list):
        super().__init__()
        self.addresses = addresses

    def forward(self, w):
        total = 0
        for i in range(16):
            a = w * (i + 1)  # 256 KiB: the allocator hands out a freed block of that size again
            self.addresses.append(a.data_ptr())
            total = total + a.sin().sum()  # sin saves a
            del a
        return total


class ReusesAddresses(nn.Module):
    def __init__(self):
        super().__init__()
        self.addresses = []
        self.layers = nn.ModuleList(FreshTensors(self.addresses) for _ in range(2))

    def forward(self, w):
        return sum(layer(w) for layer in self.layers)


def test_activations_at_a_reused_address_are_never_confused():
    model, w = ReusesAddresses(), torch.randn(1 << 16, requires_grad=True)
    model(w).backward()
    reference_grad = w.grad
    offloader = Offloader(model, HostStore(), min_bytes=0, keep_last=0)
    for _ in range(5):  # whether malloc hands an address out again depends on its state: try a few steps
        model.addresses.clear()
        w.grad = None
        with offloader:
            model(w).backward()
        assert offloader.stats.total.offloaded_tensors == 32  # no two of them taken for one
        assert torch.equal(w.grad, reference_grad)
        if len(set(model.addresses)) < 32:
            return
    pytest.skip("malloc never handed a freed address out again here, so address reuse was not exercised")


class RecordingStore(HostStore):
    """A host store that remembers the storage address and size of every tensor put."""

    def __init__(self):
        super().__init__()
        self.puts = []

    def put(self, key, tensor):
        self.puts.append((tensor.untyped_storage().data_ptr(), tensor.nbytes))
        return super().put(key, tensor)


@pytest.mark.parametrize("name", ["mlp", "gpt2", "llama"])
def test_parameters_are_never_offloaded(name):
    model, loss_of = make_model(name)
    store = RecordingStore()
    offloader = Offloader(model, store, min_bytes=0, keep_last=0)
    with offloader:
        loss_of(0).backward()
    parameters = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    assert store.puts and not parameters & {ptr for ptr, _ in store.puts}
    assert offloader.stats.total.parameter_bytes > 0


def test_min_bytes_is_respected():
    model, loss_of = make_model("mlp")
    # The MLP's activations are 8 KiB (32 x 64 floats) and 32 KiB (32 x 256): keep the first kind.
    store = RecordingStore()
    got = train("mlp", lambda m: Offloader(m, store, min_bytes=16 << 10, keep_last=0))
    assert_identical(got, reference("mlp"))
    assert store.puts and min(nbytes for _, nbytes in store.puts) >= 16 << 10
    assert got[2].stats.total.kept_bytes > 0


class SavesASmallViewOfALargeStorage(nn.Module):
    """A block whose only saved activation is one column of a 64 KiB storage (sin saves its input)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 256)

    def forward(self, x):
        return self.linear(x)[:, :1].sin()


def test_min_bytes_is_judged_by_the_storage_a_saved_view_holds():
    model = nn.Sequential(SavesASmallViewOfALargeStorage())
    x = torch.randn(64, 64)
    store = RecordingStore()
    # The saved view is 256 B; its storage (64 x 256 floats) is 64 KiB, and kept it would hold all
    # of it. The linear layer's saved input (64 x 64 floats, 16 KiB) is below min_bytes and kept.
    offloader = Offloader(model, store, min_bytes=32 << 10, keep_last=0, layers=[model[0]])
    with offloader:
        loss = model[0](x).square().sum()
        loss.backward()
    want = model[0].linear.weight.grad.clone()
    model.zero_grad()
    model[0](x).square().sum().backward()
    assert torch.equal(model[0].linear.weight.grad, want)
    assert [nbytes for _, nbytes in store.puts] == [64 * 256 * 4]
    assert offloader.stats.largest[0] == 64 * 256 * 4


class SavesItsInput(nn.Module):
    """A block whose first op saves the block's input (the matrix product saves it for the weight's
    gradient), then an activation of its own."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(256, 256)

    def forward(self, x):
        return torch.tanh(self.linear(x))


@pytest.mark.parametrize("rows", [32, 4096])
def test_a_slice_of_the_callers_data_is_kept_not_written_whole(rows):
    """A batch sliced from a 4 MiB dataset the caller holds was offloaded as its whole storage:
    4 MiB written and read back (more than keeping it) for a 32 KiB batch, freeing nothing. A slice
    of at least half its storage, or the model's own activations, are offloaded as before."""
    data = torch.randn(4096, 256)
    model = nn.Sequential(SavesItsInput())
    store = RecordingStore()
    offloader = Offloader(model, store, min_bytes=0, keep_last=0, layers=[model[0]])
    with offloader:
        model(data[:rows]).sum().backward()
    want = model[0].linear.weight.grad.clone()
    model.zero_grad()
    model(data[:rows]).sum().backward()
    assert torch.equal(model[0].linear.weight.grad, want)
    written = sorted(nbytes for _, nbytes in store.puts)
    activation = rows * 256 * 4  # tanh's output, the block's own
    assert written == ([activation] if rows == 32 else [activation, data.numel() * 4])


def test_prefetch_reads_ahead_and_without_it_backward_waits():
    for prefetch in (1, 0):
        model, loss_of = make_model("mlp")
        offloader = Offloader(model, HostStore(), min_bytes=0, prefetch=prefetch)
        with offloader:
            loss_of(0).backward()
        offloaded = offloader.stats.total.offloaded_tensors
        assert offloaded > 0
        if prefetch:
            assert (offloader.stats.prefetched_loads, offloader.stats.demand_loads) == (offloaded, 0)
        else:
            assert (offloader.stats.prefetched_loads, offloader.stats.demand_loads) == (0, offloaded)


class LoggingStore(HostStore):
    """A host store that appends ("put", key) and ("read", key) to ``events`` as transfers start."""

    def __init__(self, events: list):
        super().__init__()
        self.events = events

    def put(self, key, tensor):
        self.events.append(("put", key))
        return super().put(key, tensor)

    def get(self, key, out):
        self.events.append(("read", key))
        return super().get(key, out)


@pytest.mark.parametrize("prefetch", [1, 2])
@pytest.mark.parametrize("offloaded", [[0], [0, 1], [1, 3]])
def test_a_layer_is_read_back_when_backward_reaches_the_layer_prefetch_above_it_not_earlier(prefetch, offloaded):
    """Reading a layer back at the start of backward would put its bytes on the device again where
    the activation peak is (the first layer offloaded alone would then lower no peak): each read
    starts between the backward of layer ``i + prefetch + 1`` and that of layer ``i + prefetch``."""
    layers = 5
    torch.manual_seed(0)
    model = MLPStack(layers=layers)
    events = []
    for index, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(lambda *_, i=index: events.append(("forward", i)))
        layer.register_full_backward_hook(lambda *_, i=index: events.append(("backward", i)))
    store = LoggingStore(events)
    decide = lambda i: "offload" if i in offloaded else "keep"  # noqa: E731
    offloader = Offloader(model, store, policy=decide, min_bytes=0, keep_last=0, prefetch=prefetch)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with offloader:
        model(x, y).backward()
    assert offloader.stats.demand_loads == 0  # every read was started ahead
    finished = [i for kind, i in events if kind == "backward"]
    assert finished == list(reversed(range(layers)))
    layer_of, running = {}, None  # a put's layer: the layer whose forward was running
    for kind, value in events:
        if kind == "forward":
            running = value
        elif kind == "put":
            layer_of[value] = running
    assert sorted(set(layer_of.values())) == offloaded
    for target in offloaded:
        reads = [n for n, (kind, key) in enumerate(events) if kind == "read" and layer_of[key] == target]
        above = target + prefetch  # the reads start as backward enters this layer
        done_above = events.index(("backward", above + 1)) if above + 1 < layers else -1
        done_at = events.index(("backward", above)) if above < layers else -1
        assert reads, events
        assert all(done_above < n for n in reads), (target, events)
        if done_at >= 0:
            assert all(n < done_at for n in reads), (target, events)


@pytest.mark.parametrize(
    "kind, prefetch",  # stores whose reads end on another thread
    [
        ("direct_file", 1),
        *(
            pytest.param(*case, marks=pytest.mark.full)
            for case in [("direct_file", 0), ("emulated", 0), ("emulated", 1)]
        ),
    ],
)
def test_read_back_bytes_go_with_their_last_use_not_at_the_step_end(kind, prefetch, disk):
    """Each read-back buffer is freed once backward has used its tensors, inside the step: nothing
    the cache keeps until the step's end (a future's callback, say) may hold it. Every tensor is
    read back (``always_read_back``), so there are buffers to check however fast the writes are."""
    model, loss_of = make_model("mlp")
    buffers = []
    with make_store(kind, disk) as store:
        get = store.get
        store.get = lambda key, out: buffers.append(weakref.ref(out)) or get(key, out)
        with Offloader(model, store, min_bytes=0, keep_last=0, prefetch=prefetch, always_read_back=True):
            loss_of(0).backward()
            gc.collect()
            alive = sum(ref() is not None for ref in buffers)
    assert buffers and alive == 0, f"{alive} of {len(buffers)} read-back buffers outlived their use"


@pytest.mark.parametrize("prefetch", [1, 0])
def test_always_read_back_reads_every_offloaded_tensor_whatever_the_timing(prefetch, disk):
    """Writes far slower than forward: without ``always_read_back`` backward would find them still
    running and use the tensors in memory (how many depends on timing). With it, backward waits
    for each write and every offloaded byte comes back from the store, in every step, and the
    step is still bit-identical."""
    store = EmulatedStore(0.05, inner=DirectFileStore(disk, threads=2, block_bytes=64 << 10))

    def offloader(model):
        return Offloader(model, store, min_bytes=0, keep_last=0, prefetch=prefetch, always_read_back=True)

    def every_byte_read_back(o):
        assert o.stats.store.bytes_read == o.stats.store.bytes_written == o.stats.total.offloaded_bytes > 0
        assert (o.stats.prefetched_loads, o.stats.demand_loads) == (
            (o.stats.total.offloaded_tensors, 0) if prefetch else (0, o.stats.total.offloaded_tensors)
        )

    with store:
        got = train("mlp", offloader, after_step=every_byte_read_back)
    assert_identical(got, reference("mlp"))


def test_the_last_layers_are_kept():
    model, loss_of = make_model("mlp")
    offloader = Offloader(model, HostStore(), min_bytes=0, keep_last=2)
    with offloader:
        loss_of(0).backward()
    layers = offloader.stats.layers
    assert [layers[i].offloaded_bytes > 0 for i in range(4)] == [True, True, False, False]
    assert layers[None].offloaded_bytes == 0  # outside the layers: kept


def test_an_error_in_backward_leaves_no_files(disk):
    model, loss_of = make_model("gpt2")
    store = DirectFileStore(disk, block_bytes=64 << 10)
    offloader = Offloader(model, store, min_bytes=0, keep_last=0)

    def fail(grad):
        raise RuntimeError("boom in backward")

    def fail_in_backward(module, args, output):
        (output[0] if isinstance(output, tuple) else output).register_hook(fail)

    hook = model.transformer.h[1].register_forward_hook(fail_in_backward)
    with pytest.raises(RuntimeError, match="boom in backward"), offloader:
        loss = loss_of(0)
        offloader.flush()
        assert list(store.directory.iterdir())  # files exist mid-step
        loss.backward()
    check_step_left_nothing(offloader)
    hook.remove()
    with offloader:  # the next step works
        loss_of(1).backward()
    check_step_left_nothing(offloader)
    store.close()


def test_an_error_in_forward_leaves_no_files(disk):
    model, loss_of = make_model("mlp")
    store = DirectFileStore(disk)

    def policy(layer):
        if layer == 2:
            raise ValueError("policy failed")
        return "offload"

    offloader = Offloader(model, store, min_bytes=0, policy=policy, keep_last=0)
    with pytest.raises(ValueError, match="policy failed"), offloader:
        loss_of(0)
    check_step_left_nothing(offloader)
    store.close()


def test_backward_after_the_step_ended_raises_instead_of_reading_freed_bytes():
    model, loss_of = make_model("mlp")
    offloader = Offloader(model, HostStore(), min_bytes=0, keep_last=0)
    with offloader:
        loss = loss_of(0)
    with pytest.raises(RuntimeError, match="used after the Offloader freed it"):
        loss.backward()


def test_a_failed_write_stops_the_step_with_its_one_line_error(disk, monkeypatch):
    model, loss_of = make_model("mlp")
    store = DirectFileStore(disk)
    offloader = Offloader(model, store, min_bytes=0, keep_last=0)

    def no_space(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", no_space)
    with pytest.raises(UserError, match="no space left"), offloader:
        loss_of(0).backward()
    check_step_left_nothing(offloader)
    store.close()


class SavesThenModifies(nn.Module):
    """sin() saves its input, which is then modified in place: autograd refuses that."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(256, 256) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            h = layer(x)
            x = h.sin()
            h.mul_(2)
        return x.sum()


def test_in_place_modification_of_a_saved_tensor_is_caught():
    torch.manual_seed(0)
    model, x = SavesThenModifies(), torch.randn(64, 256)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        model(x).backward()  # without the offloader
    with pytest.raises(RuntimeError, match="modified in place after it was saved"):
        with Offloader(model, HostStore(), policy="keep", min_bytes=0):
            model(x).backward()
    # Offloaded, and changed while its write runs: the stored bytes may be either version.
    store = EmulatedStore(0.01)  # slow writes: the change comes while they run
    with pytest.raises(RuntimeError, match="modified in place after it was saved"):
        with Offloader(model, store, min_bytes=0, keep_last=0):
            model(x).backward()


def test_find_layers_and_bad_arguments():
    assert [type(m).__name__ for m in find_layers(gpt2())] == ["GPT2Block"] * 3
    assert [type(m).__name__ for m in find_layers(llama())] == ["LlamaDecoderLayer"] * 3
    with pytest.raises(UserError, match="no list of repeated blocks"):
        find_layers(nn.Linear(3, 3))
    model = MLPStack()
    with pytest.raises(UserError, match="unknown offloading policy"):
        Offloader(model, HostStore(), policy="adaptive")
    with pytest.raises(UserError, match="keep_last"):
        Offloader(model, HostStore(), keep_last=-1)
    with pytest.raises(TypeError, match="Store"):
        Offloader(model, object())
    offloader = Offloader(model, HostStore(), policy=lambda layer: "maybe", keep_last=0)
    with pytest.raises(UserError, match="returned 'maybe'"), offloader:
        model(torch.randn(2, 16), torch.randn(2, 1))


# -- GPU -----------------------------------------------------------------------------------------


@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.mark.gpu
@pytest.mark.parametrize("store", ["host", "direct_file", "emulated"])
@pytest.mark.parametrize("name", ["mlp", "gpt2", "llama"])
def test_gpu_losses_and_gradients_are_bit_identical(name, store, disk, deterministic):
    with make_store(store, disk) as s:
        got = train(name, lambda m: Offloader(m, s, min_bytes=0, keep_last=0), "cuda", check_step_left_nothing)
    assert_identical(got, reference(name, "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("store", ["host", "direct_file"])
def test_gpu_a_step_on_a_side_stream_is_bit_identical(store, disk, deterministic):
    """Forward and backward queued on a stream of the user's, not the default one: every put must
    wait for the saved tensor's producer on that stream (ready_event reads the current stream).
    Each block first sleeps on the current stream, so its outputs come late there while the
    default stream stays idle: a copy ordered after the default stream instead would run at once
    and store unfinished bytes, and the step would differ from the same training without
    offloading. (Check that it can fail: record ready_event on torch.cuda.default_stream().)"""
    side = torch.cuda.Stream()

    def delayed(make_offloader):
        def args(model):
            for block in find_layers(model):
                block.register_forward_pre_hook(lambda module, inputs: torch.cuda._sleep(2_000_000))
            return make_offloader(model) if make_offloader else None

        return args

    def on_side_stream(offloader_args):
        with torch.cuda.stream(side):
            got = train("llama", offloader_args, "cuda")
        torch.cuda.synchronize()
        return got

    want = on_side_stream(None)
    with make_store(store, disk) as s:
        got = on_side_stream(delayed(lambda m: Offloader(m, s, min_bytes=0, keep_last=0)))
        check_step_left_nothing(got[2])
    assert_identical(got, want)
    assert got[2].stats.total.offloaded_bytes > 0


@pytest.mark.gpu
def test_gpu_offloading_frees_device_memory_after_forward():
    torch.manual_seed(0)
    model = MLPStack(dim=1024, layers=4).cuda()
    x, y = torch.randn(4096, 16, device="cuda"), torch.randn(4096, 1, device="cuda")
    held = {}
    for policy in ("keep", "offload_all"):
        offloader = Offloader(model, HostStore(), policy=policy, keep_last=0)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with offloader:
            loss = model(x, y)
            offloader.flush()
            held[policy] = torch.cuda.memory_allocated() - before
            loss.backward()
        model.zero_grad(set_to_none=True)
        del loss
    # Each block saves about 4096 x (1024 + 3 x 4096) floats: ~210 MiB; offloaded, little stays.
    assert held["offload_all"] < 0.2 * held["keep"]


@pytest.mark.gpu
def test_gpu_offloading_the_first_block_alone_lowers_the_steps_peak():
    """The peak of a step is at the start of backward, every block's tensors held: offloading the
    first block must lower it by about that block's bytes, so its read back must wait for backward
    to reach the block above (read at backward's first unpack, it was back on the GPU at the peak)."""
    torch.manual_seed(0)
    model = MLPStack(dim=1024, layers=4).cuda()
    x, y = torch.randn(4096, 16, device="cuda"), torch.randn(4096, 1, device="cuda")
    peaks, offloaded = {}, 0
    for name, policy in (("keep", "keep"), ("first", lambda i: "offload" if i == 0 else "keep")):
        offloader = Offloader(model, HostStore(), policy=policy, keep_last=0)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with offloader:
            loss = model(x, y)
            offloader.flush()  # the write has landed (the block's memory is gone) whatever the timing
            loss.backward()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - before
        del loss
        offloaded = offloaded or offloader.stats.total.offloaded_bytes
        model.zero_grad(set_to_none=True)
    assert offloaded > 0
    assert peaks["keep"] - peaks["first"] > 0.5 * offloaded, (peaks, offloaded)


@pytest.mark.full
def test_training_on_the_generated_corpus_converges_identically_with_offloading(disk):
    """The convergence check: 150 AdamW steps of a tiny Llama on the Markov language, keep against
    offloading to real files (all but the last block) and against a per-block mix (the first
    block offloaded, the second kept). Every step's loss is bit-identical to keep's, and the loss ends within 0.5 nats
    of the language's entropy rate (uniform guessing is ~3.7 nats above it)."""
    from systems.ssdtrain import planning
    from workloads.llm.data import MarkovLanguage, batches, uniform_loss
    from workloads.llm.layers import blocks
    from workloads.llm.models import build, spec

    s = spec("llama", "tiny", micro_batch=16)
    language = MarkovLanguage(s.vocab, seed=0)

    def losses_of(policy):
        model = build(s, seed=0).model
        layers = [block for _, block in blocks(model)]
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        stream, losses = batches(s, "markov", seed=1, language=language), []
        with DirectFileStore(disk, threads=2, block_bytes=64 << 10) as store:
            offloader = policy and Offloader(model, store, policy=policy, layers=layers, min_bytes=0)
            for _ in range(150):
                optimizer.zero_grad()
                with offloader or contextlib.nullcontext():
                    loss = model(**next(stream)).loss
                    loss.backward()
                optimizer.step()
                losses.append(loss.detach())
        return torch.stack(losses)

    keep = losses_of(None)
    assert keep[-20:].mean() < language.entropy_rate() + 0.5 < uniform_loss(s.vocab), keep[::15]
    assert torch.equal(losses_of("offload_all"), keep)
    mixed = [planning.OFFLOAD, planning.KEEP]  # the tiny Llama's two blocks
    assert torch.equal(losses_of(lambda i: mixed[i]), keep)
    assert not list(disk.iterdir())


class HeldStore(HostStore):
    """A host store whose puts end when the test says: each put's bytes are copied at once, but its
    future completes only in :meth:`land` (as a slow disk's write would, much later)."""

    def __init__(self):
        super().__init__()
        self.waiting = {}  # store key -> the future the cache holds

    def put(self, key, tensor):
        super().put(key, tensor).result()  # the copy is done; the write "lands" later
        self.waiting[key] = held = Future()
        return held

    def land(self, keys) -> None:
        for key in list(keys):
            self.waiting.pop(key).set_result(None)


def test_an_offloaded_tensors_memory_goes_when_its_write_lands_not_when_forward_ends():
    """Block 0's saved storages stay alive while their writes are in flight and are freed the
    moment they land, while forward is still running (checked in the pre-hook of block 2); block 1's,
    whose writes have not landed, are still held; the step stays bit-identical to keep's."""
    torch.manual_seed(0)
    model = MLPStack(dim=48, layers=4)
    x, y = torch.randn(37, 16), torch.randn(37, 1)
    reference = model(x, y)
    reference.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    store = HeldStore()
    offloader = Offloader(model, store, policy="offload_all", keep_last=1, min_bytes=0)
    seen = {}

    def in_block_two(module, args):
        entries = {layer: list(offloader.cache._by_layer.get(layer, {}).values()) for layer in (0, 1)}
        assert entries[0] and entries[1]
        seen["held before"] = [not e.ref.expired() for e in entries[0]]
        store.land(e.store_key for e in entries[0])
        seen["freed after"] = [e.ref.expired() for e in entries[0]]
        seen["block 1 held"] = [not e.ref.expired() for e in entries[1]]

    hook = model.layers[2].register_forward_pre_hook(in_block_two)
    try:
        with offloader:
            loss = model(x, y)
            store.land(list(store.waiting))
            loss.backward()
    finally:
        hook.remove()
        store.close()
    assert seen["held before"] and all(seen["held before"])
    assert all(seen["freed after"])  # gone at once, two blocks before forward ends
    assert all(seen["block 1 held"])
    assert torch.equal(loss, reference)
    assert all(torch.equal(p.grad, want[n]) for n, p in model.named_parameters())
