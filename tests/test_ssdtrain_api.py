"""``systems.ssdtrain.offload`` on models the suite does not ship (a tiny Qwen3 built from its
config, a ResNet-18-shaped conv net): every policy bit-identical to training without hooks, the
blocks of any model found, the warnings and refusals, prefetch in every backward, autocast's weight
casts kept, Hugging Face gradient checkpointing composed with, and the worked example of
docs/llm_offload.md run as written."""

import contextlib
import copy
import functools
import logging
import os
import re
import threading
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from test_ssdtrain_stores import real_disk_folder
from torch import nn

from harness.errors import UserError
from systems.ssdtrain import DirectFileStore, HostStore, Offloader, find_layers, offload
from systems.ssdtrain.planning import KEEP, OFFLOAD, RECOMPUTE, Plan

logging.getLogger("transformers").setLevel(logging.ERROR)
# Deterministic cuBLAS for the GPU tests (read when cuBLAS starts; tests are imported before any runs).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
DOC = Path(__file__).resolve().parents[1] / "docs" / "llm_offload.md"
MICRO_BATCHES, STEPS = 2, 2


# -- models the suite does not ship --------------------------------------------------------------
def qwen3(layers: int = 2, attention: str = "sdpa"):
    config = transformers.Qwen3Config(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, max_position_embeddings=64, use_cache=False,
        attn_implementation=attention,
    )  # fmt: skip
    return transformers.Qwen3ForCausalLM(config)


def bart():
    """An encoder-decoder whose two stacks are of two classes (T5's share one)."""
    config = transformers.BartConfig(
        vocab_size=64, d_model=24, encoder_layers=2, decoder_layers=3, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=32,
        dropout=0.0, attention_dropout=0.0, use_cache=False,
    )  # fmt: skip
    return transformers.BartForConditionalGeneration(config)


class BasicBlock(nn.Module):
    def __init__(self, inp: int, out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.downsample = (
            nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))
            if stride != 1 or inp != out
            else None
        )

    def forward(self, x):
        skip = x if self.downsample is None else self.downsample(x)
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + skip)


class ResNetish(nn.Module):
    """ResNet-18's shape (a stem, four stages of two BasicBlocks, a head), a few channels wide."""

    def __init__(self, width: int = 4, classes: int = 5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        widths = [width, 2 * width, 4 * width, 8 * width]
        stages, inp = [], width
        for i, out in enumerate(widths):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(inp, out, stride), BasicBlock(out, out, 1)))
            inp = out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(inp, classes)

    def forward(self, x, labels):
        h = self.stem(x)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            h = stage(h)
        return F.cross_entropy(self.fc(h.mean((2, 3))), labels)


def make(name: str):
    """A seeded model and the loss of micro-batch ``i`` (random, odd-sized inputs)."""
    torch.manual_seed(0)
    if name == "qwen3":
        model = qwen3()

        def loss(i):
            ids = torch.randint(0, 96, (3, 19), generator=torch.Generator().manual_seed(10 + i))
            return model(input_ids=ids, labels=ids).loss

    elif name == "bart":
        model = bart()

        def loss(i):
            g = torch.Generator().manual_seed(10 + i)
            source, target = torch.randint(3, 64, (3, 13), generator=g), torch.randint(3, 64, (3, 9), generator=g)
            return model(input_ids=source, labels=target).loss

    else:
        model = ResNetish()

        def loss(i):
            g = torch.Generator().manual_seed(10 + i)
            return model(torch.randn(3, 3, 17, 15, generator=g), torch.randint(0, 5, (3,), generator=g))

    model.train()
    return model, loss


def train(name: str, session=None, autocast: bool = False):
    """Losses and gradients of STEPS optimizer steps of MICRO_BATCHES micro-batches each, all inside
    one ``session(model)`` block (or none)."""
    model, loss_of = make(name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    block = session(model) if session else contextlib.nullcontext()
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with block:
        for step in range(STEPS):
            optimizer.zero_grad()
            for micro in range(MICRO_BATCHES):
                with cast:
                    loss = loss_of(step * MICRO_BATCHES + micro)
                loss.backward()
                losses.append(loss.detach().clone())
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            optimizer.step()
    return losses, grads, block


def assert_identical(got, want, micro_batches=STEPS * MICRO_BATCHES):
    """Losses and gradients of two runs (``run``'s ``(losses, grads, ...)``) equal bit for bit."""
    assert len(got[0]) == len(want[0]) == micro_batches
    for i, (a, b) in enumerate(zip(got[0], want[0])):
        assert torch.equal(a, b), f"loss differs at micro-batch {i}"
    for step, (a, b) in enumerate(zip(got[1], want[1])):
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), f"gradient of {name} differs at step {step}"


_references = {}


def reference(name: str, autocast: bool = False):
    if (name, autocast) not in _references:
        _references[name, autocast] = train(name, autocast=autocast)
    return _references[name, autocast]


def every_other(index: int) -> str:
    return (OFFLOAD, RECOMPUTE, KEEP)[index % 3]


def policy_args(policy: str, blocks: int) -> dict:
    """offload()'s arguments for ``policy`` (a planned one on a fixed bandwidth, so the plan does not
    depend on how fast this machine is)."""
    if policy in ("keep", "recompute", "save_on_cpu"):
        return {"policy": policy}
    args = {"store": HostStore(), "min_bytes": 0}
    if policy == "plan":
        decisions = tuple((RECOMPUTE, OFFLOAD, KEEP)[i % 3] for i in range(blocks - 1)) + (OFFLOAD,)
        return args | {"policy": Plan(decisions, 0.0, 0, 0.0)}
    if policy == "callable":
        return args | {"policy": every_other}
    if policy == "planner":
        return args | {"policy": "planner", "budget": 0.5, "bandwidth": 1e3}
    if policy == "offload_adaptive":
        return args | {"policy": policy, "bandwidth": 1e15}
    return args | {"policy": policy}


POLICIES = ["keep", "recompute", "save_on_cpu", "offload_all", "offload_adaptive", "planner", "plan", "callable"]
BLOCKS = {"qwen3": 2, "resnet": 8, "bart": 5}


def check_policy(name: str, policy: str):
    sessions = []

    def session(model):
        sessions.append(offload(model, **policy_args(policy, BLOCKS[name])))
        return sessions[-1]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these configurations may warn
        got = train(name, session)
    assert_identical(got, reference(name))
    stats = sessions[0].stats
    if policy in ("offload_all", "plan", "callable"):
        assert stats.total.offloaded_tensors > 0
    if policy in ("offload_adaptive", "planner"):
        plan = sessions[0].plan
        assert plan is not None and len(plan.decisions) == BLOCKS[name]
        # Planned from a 1 kB/s store, the planner recomputes instead of offloading; from an
        # infinitely fast one, SSDTrain's rule offloads every block but the last.
        want = (OFFLOAD,) * (BLOCKS[name] - 1) + (KEEP,) if policy == "offload_adaptive" else None
        assert plan.decisions == want if want else OFFLOAD not in plan.decisions and RECOMPUTE in plan.decisions


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_matches_keep_bit_for_bit_on_a_tiny_qwen3(policy):
    check_policy("qwen3", policy)


@pytest.mark.parametrize("policy", ["recompute", "offload_all"])
def test_offloading_and_recomputing_a_resnet_match_keep_bit_for_bit(policy):
    check_policy("resnet", policy)


@pytest.mark.parametrize("policy", ["recompute", "offload_all", "planner"])
def test_both_stacks_of_an_encoder_decoder_of_two_block_classes_match_keep_bit_for_bit(policy):
    check_policy("bart", policy)


@pytest.mark.full
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_matches_keep_bit_for_bit_on_a_resnet(policy):
    check_policy("resnet", policy)


def test_offloading_to_files_matches_keep_bit_for_bit(tmp_path):
    with real_disk_folder(tmp_path) as folder, DirectFileStore(folder, threads=2, block_bytes=64 << 10) as store:
        sessions = []

        def session(model):
            sessions.append(offload(model, store=store, min_bytes=0, keep_last=0, always_read_back=True))
            return sessions[-1]

        assert_identical(train("qwen3", session), reference("qwen3"))
        assert sessions[0].stats.store.bytes_written > 0 and sessions[0].stats.store.bytes_read > 0
        assert len(store) == 0 and list(store.directory.iterdir()) == []


# -- blocks ---------------------------------------------------------------------------------------
def test_the_blocks_of_any_model_are_found():
    resnet = ResNetish()
    assert find_layers(resnet) == [*resnet.layer1, *resnet.layer2, *resnet.layer3, *resnet.layer4]
    assert [type(b).__name__ for b in find_layers(qwen3(3))] == ["Qwen3DecoderLayer"] * 3
    config = transformers.T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=3)
    t5 = transformers.T5ForConditionalGeneration(config)
    assert find_layers(t5) == [*t5.encoder.block, *t5.decoder.block]
    model = bart()
    assert find_layers(model) == [*model.model.encoder.layers, *model.model.decoder.layers]
    with pytest.raises(UserError, match="no list of repeated blocks"):
        find_layers(nn.Linear(3, 3))


class _Headed(nn.Module):
    """A transformer-like layer: four small heads in a list, and most of its weights beside them."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(width, width // 4) for _ in range(4))
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + torch.cat([head(x) for head in self.heads], -1)
        return x + self.down(torch.tanh(self.up(x)))


class _InADict(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({f"layer{i}": _Headed() for i in range(3)})

    def forward(self, x):
        for layer in self.layers.values():
            x = layer(x)
        return x.square().mean()


class _AsAttributes(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer0, self.layer1, self.layer2 = _Headed(), _Headed(), _Headed()

    def forward(self, x):
        return self.layer2(self.layer1(self.layer0(x))).square().mean()


def test_blocks_in_a_module_dict_are_found_and_blocks_held_as_attributes_are_asked_for():
    """Both took the four heads of each layer as the blocks, without a word: a fraction of the
    saved bytes (the heads') was offloaded or recomputed, the rest held outside every block."""
    in_a_dict = _InADict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert find_layers(in_a_dict) == list(in_a_dict.layers.values())
    with pytest.warns(UserWarning) as caught:
        heads = find_layers(_AsAttributes())
    assert [type(h).__name__ for h in heads] == ["Linear"] * 12 and len(caught) == 1
    message = str(caught[0].message)
    assert re.fullmatch(
        r"find_layers: the 12 blocks found \(Linear\) hold \d+% of the parameters of the 3 _Headed modules "
        r"around them: if those are the model's blocks, pass them \(layers=\[\.\.\.\]\)",
        message,
    ), message


class _NamedParts(nn.Module):
    """A model whose parts are a dict of several classes, its blocks in a list inside one of them."""

    def __init__(self):
        super().__init__()
        body = nn.Module()
        body.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4))
        self.parts = nn.ModuleDict({"embed": nn.Embedding(50, 16), "body": body, "head": nn.Linear(16, 2)})


def test_a_dict_of_parts_of_several_classes_is_no_stack_and_shared_embeddings_raise_no_warning():
    """The dict was taken for a hybrid model's list of layers (refused, naming its keys' class,
    str); T5's stacks, which hold the shared embedding table, were warned of as larger modules."""
    named = _NamedParts()
    config = transformers.T5Config(vocab_size=32128, d_model=64, d_kv=8, d_ff=128, num_layers=2, num_decoder_layers=2)
    t5 = transformers.T5ForConditionalGeneration(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert find_layers(named) == list(named.parts["body"].blocks)
        assert find_layers(t5) == [*t5.encoder.block, *t5.decoder.block]


def test_blocks_that_hold_a_dict_of_one_module_per_relation_are_the_blocks():
    """A list of PyG's HeteroConv (a dict of one conv per edge type in each): the convs inside,
    of the same parameters in all, were taken, so keep_last kept one relation's conv."""
    from torch_geometric.nn import HeteroConv, SAGEConv

    relations = [("a", "to", "b"), ("b", "to", "a"), ("a", "self", "a")]
    model = nn.Module()
    model.layers = nn.ModuleList(HeteroConv({r: SAGEConv(8, 8) for r in relations}) for _ in range(3))
    assert find_layers(model) == list(model.layers)


class _Adapted(nn.Module):
    """A layer of a hybrid model: its own weights, and a list of small adapters (Zamba2's LoRA)."""

    def __init__(self, width: int, mixer: type):
        super().__init__()
        self.mixer = mixer(width, width)
        self.adapters = nn.ModuleList(nn.Sequential(nn.Linear(width, 2), nn.Linear(2, width)) for _ in range(2))

    def forward(self, x):
        return x + self.mixer(x) + sum(adapter(x) for adapter in self.adapters)


class _MambaLayer(_Adapted):
    pass


class _HybridLayer(_Adapted):
    pass


class _Conv1dLike(nn.Linear):  # a class of its own beside nn.Linear, as a Mamba layer is beside attention
    pass


class _RawMamba(nn.Module):
    """A layer whose weights are its own parameters, no modules inside."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width)

    def forward(self, x):
        return x + torch.tanh(x @ self.weight)


class _RawAttention(_RawMamba):
    pass


class _Stage(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.blocks = nn.Sequential(*(_Adapted(width, nn.Linear) for _ in range(2)))

    def forward(self, x):
        return self.blocks(x)


class _DoubleConv(nn.Module):
    """A U-Net's conv block: an nn.Sequential of single operators of several classes."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(),
            nn.Conv2d(c_out, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(),
        )  # fmt: skip

    def forward(self, x):
        return self.double_conv(x)


def test_a_head_or_classifier_of_several_operator_classes_never_hides_the_blocks():
    """A GPT whose lm_head (LayerNorm, Linear to a large vocabulary) holds more than the blocks, a
    CNN whose classifier (Linear, ReLU, Dropout, Linear) does: the blocks are found, not refused
    in favour of the head."""
    gpt = nn.Module()
    gpt.emb = nn.Embedding(3000, 32)
    gpt.blocks = nn.ModuleList(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True) for _ in range(3))
    gpt.lm_head = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 3000))
    assert sum(p.numel() for p in gpt.lm_head.parameters()) > 2 * sum(p.numel() for p in gpt.blocks.parameters())
    assert find_layers(gpt) == list(gpt.blocks)
    cnn = nn.Module()
    cnn.features = nn.ModuleList(_DoubleConv(3 if i == 0 else 8, 8) for i in range(4))
    cnn.classifier = nn.Sequential(nn.Linear(8 * 64, 256), nn.ReLU(), nn.Dropout(), nn.Linear(256, 10))
    assert find_layers(cnn) == list(cnn.features)


def test_a_unet_of_named_blocks_is_told_to_pass_them_not_pointed_at_a_conv_block_s_operators():
    """A U-Net whose blocks are attributes (inc, down1, up1...): no list of blocks. The refusal is
    the plain one, not 'pass layers=list(model.inc.double_conv)' (12% of its activations)."""
    unet = nn.Module()
    for name, (c_in, c_out) in {"inc": (3, 8), "down1": (8, 16), "down2": (16, 32), "up1": (48, 16)}.items():
        setattr(unet, name, _DoubleConv(c_in, c_out))
    with pytest.raises(UserError, match=r"^Module has no list of repeated blocks.*pass the blocks explicitly") as err:
        find_layers(unet)
    assert "double_conv" not in str(err.value)


def test_a_hybrid_model_s_layers_of_several_classes_are_refused_not_its_adapters_taken():
    """Zamba2's layers (Mamba and hybrid ones in one list): the only repeated class was the tiny
    adapters inside them, taken as the blocks without a word (17 KB of 1.4 MB offloaded)."""
    hybrid = nn.Sequential(nn.Embedding(10, 32))
    hybrid.layers = nn.ModuleList(kind(32, nn.Linear) for kind in (_MambaLayer, _HybridLayer) * 2)
    message = (
        r"^Sequential\.layers holds the model's blocks in one list of several classes \(_HybridLayer, _MambaLayer\)"
    )
    with pytest.raises(UserError, match=message) as err:
        find_layers(hybrid)
    assert "layers=list(model.layers)" in str(err.value) and "\n" not in str(err.value)
    # Layers of alternating classes and no repeated part inside them: the same refusal, not "no list".
    plain = nn.Module()  # no list of one class anywhere: the refusal names the list all the same
    plain.layers = nn.ModuleList(kind(32, nn.Linear) for kind in (_MambaLayer, _HybridLayer))
    with pytest.raises(UserError, match=r"^Module\.layers holds the model's blocks in one list of several classes"):
        find_layers(plain)
    # Layers of the user's classes holding parameters of their own, no modules inside: layers all
    # the same, not LayerNorms repeated beside them taken as the blocks.
    raw = nn.Module()
    raw.layers = nn.ModuleList(kind(64) for kind in (_RawMamba, _RawMamba, _RawAttention) * 4)
    raw.norms = nn.ModuleList(nn.LayerNorm(64) for _ in range(12))
    with pytest.raises(UserError, match=r"^Module\.layers holds the model's blocks in one list of several classes"):
        find_layers(raw)
    # Of two such lists, the larger is named (the first met was, however small).
    two = nn.Module()
    two.small = nn.ModuleList(kind(4) for kind in (_RawMamba, _RawAttention))  # met first
    two.layers = nn.ModuleList(kind(64) for kind in (_RawMamba, _RawAttention) * 2)
    with pytest.raises(UserError, match=r"^Module\.layers holds the model's blocks"):
        find_layers(two)
    # One nested in another (a body holding the layers, in a stem-body-head Sequential): the inner.
    wrapped = nn.Module()
    wrapped.net = nn.Sequential(nn.Linear(64, 64), nn.Sequential(*two.layers), _RawAttention(64))
    with pytest.raises(UserError, match=r"^Module\.net\.1 holds the model's blocks"):
        find_layers(wrapped)
    # A list of single operators of several classes is a part of a model, not its layers.
    operators = nn.Module()
    operators.layers = nn.ModuleList([nn.Linear(32, 32), nn.LayerNorm(32)] * 2)
    with pytest.raises(UserError, match=r"^Module has no list of repeated blocks"):
        find_layers(operators)
    # A stem, stages of blocks and a head in one nn.Sequential (the model's own or a submodule): the
    # stages' blocks, as before; the stem and head hold far less than twice what the blocks hold.
    staged = nn.Sequential(nn.Linear(32, 32), _Stage(32), nn.LayerNorm(32), _Stage(32), nn.Linear(32, 4))
    assert find_layers(staged) == [*staged[1].blocks, *staged[3].blocks]
    nested = nn.Module()
    nested.body = staged
    assert find_layers(nested) == [*staged[1].blocks, *staged[3].blocks]


class _Residual(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class _Wide(_Residual):
    """A teacher's block: a class of its own, wider than the student's."""


class _Distillation(nn.Module):
    """A large frozen teacher run under no_grad beside a small student that trains."""

    def __init__(self):
        super().__init__()
        self.teacher = nn.Sequential(*(_Wide(16, 64) for _ in range(6))).requires_grad_(False)
        self.student = nn.Sequential(*(_Residual(16, 16) for _ in range(4)))

    def forward(self, x):
        with torch.no_grad():
            target = self.teacher(x)
        return (self.student(x) - target).square().mean()


class _AdaptedFrozenModel(nn.Module):
    """A trained adapter's two blocks feeding a frozen model's six, which gradients flow through."""

    def __init__(self):
        super().__init__()
        self.adapter = nn.Sequential(*(_Residual(16, 16) for _ in range(2)))
        self.frozen = nn.Sequential(*(_Wide(16, 64) for _ in range(6))).requires_grad_(False)
        self.drops = nn.ModuleList(nn.Dropout(0.0) for _ in range(6))  # a list without parameters

    def forward(self, x):
        return self.frozen(self.adapter(x)).square().mean()


def test_frozen_blocks_are_found_with_a_warning_where_others_train():
    """The largest list is taken, frozen or not: a frozen model the trained blocks feed saves
    activations (taking the adapter's blocks instead held nearly all of keep's bytes under
    recompute); where its blocks run under no_grad (a teacher), the warning says to pass the others."""
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(5))
    for model, others in ((_Distillation(), "student"), (_AdaptedFrozenModel(), "adapter")):
        with pytest.warns(UserWarning, match=r"^find_layers: the 6 blocks found \(_Wide\) have no trainable"):
            found = find_layers(model)
        assert found == list(model.teacher if others == "student" else model.frozen)
        kept = {}
        for policy in ("keep", "recompute"):
            layers = list(getattr(model, others)) if others == "student" else None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with offload(model, policy=policy, min_bytes=0, layers=layers) as session:
                    model(x).backward()
            kept[policy] = session.stats.total.kept_bytes
        assert kept["recompute"] < kept["keep"], (others, kept)
    # A model frozen whole (tuned through its input: a soft prompt) warns of nothing.
    frozen = nn.Sequential(*(_Residual(16, 16) for _ in range(3))).requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert find_layers(frozen) == list(frozen)


class _ScriptedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(_Residual(16, 16) for _ in range(3))
        self.head = nn.Sequential(torch.jit.script(nn.Linear(16, 4)), nn.LogSoftmax(-1))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).sum()


def test_torchscript_modules_are_never_blocks_and_refused_as_given_blocks_in_one_line():
    """A TorchScript module anywhere in a list made find_layers fail inside torch.jit (its class's
    forward raises when read); given as blocks, torch refused the hooks deep in the first one."""
    model = _ScriptedHead()
    assert find_layers(model) == list(model.blocks)
    inside = nn.Module()
    inside.layers = nn.ModuleList(nn.ModuleDict({"ff": torch.jit.script(nn.Linear(8, 8))}) for _ in range(3))
    with pytest.raises(UserError, match=r"has no list of repeated blocks"):  # not the scripted modules inside
        find_layers(inside)
    scripted = nn.Sequential(*(torch.jit.script(_Residual(16, 16)) for _ in range(3)))
    with pytest.raises(UserError, match=r"^\w+ has no list of repeated blocks"):
        find_layers(scripted)
    with pytest.raises(
        UserError, match=r"^layers lists a TorchScript module \(\w+\), which takes no hooks: pass the eager"
    ):
        offload(scripted, policy="recompute", layers=list(scripted))


def test_blocks_given_as_a_module_dict_are_its_members():
    """list(ModuleDict) gives its keys: the dict was refused with "pass [block]"."""
    model = _InADict()
    session = offload(model, policy="recompute", layers=model.layers)
    assert session.layers == list(model.layers.values())


class _RenormalisingBlock(nn.Module):
    """A block whose forward changes a parameter in place: an embedding with max_norm."""

    def __init__(self):
        super().__init__()
        self.position = nn.Embedding(8, 16, max_norm=1.0)
        self.linear = nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.tanh(self.linear(x + self.position(torch.arange(x.shape[1]))))


def test_a_recomputed_block_whose_parameter_changed_says_whether_its_own_forward_changed_it():
    """The block's own forward (max_norm) was blamed on "an optimizer step before backward?", and
    autograd was said to raise the same without recomputation, which it does not."""
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(9))
    model = nn.Sequential(_RenormalisingBlock(), _RenormalisingBlock())
    own = r"^parameter weight of a recomputed _RenormalisingBlock is changed in place by the block's own forward "
    with pytest.raises(RuntimeError, match=own + r"\(nn.Embedding's max_norm"), offload(model, policy="recompute"):
        model(x).square().mean().backward()
    model = nn.Sequential(*(_Residual(16, 16) for _ in range(2)))
    with pytest.raises(RuntimeError, match=r"was modified in place between its forward and its recomputation"):
        with offload(model, policy="recompute"):
            loss = model(x).square().mean()
            with torch.no_grad():
                model[0].up.weight.add_(1.0)  # as an optimizer step would
            loss.backward()


def test_bad_arguments_are_one_line():
    model = qwen3()
    cases = [
        (dict(policy="adaptive"), "unknown policy 'adaptive'"),
        (dict(policy="offload_all"), "offloads: give offload"),
        (dict(policy="keep", store=HostStore()), "offloads nothing: it takes no store"),
        (dict(policy=Plan((KEEP,), 0.0, 0, 0.0), store=HostStore()), "1 decisions for the model's 2 blocks"),
        (
            dict(policy=Plan((KEEP, KEEP), 0.0, 0, 0.0, budgets=(0.5, None))),
            "the plan decides 'keep' for a block it budgets at 0.5 (expected 'budget_0.5' or 'offload_budget_0.5')",
        ),
        (dict(policy="planner", store=HostStore()), "needs budget="),
        (dict(policy="offload_all", store=HostStore(), layers=[nn.Linear(2, 2)]), "the model's own submodules"),
        (dict(policy="offload_all", store=HostStore(), min_bytes=-1), "min_bytes must be a non-negative"),
        (
            dict(policy="offload_all", store=HostStore(), keep_last=True),
            "keep_last must be a non-negative integer, got True",
        ),
        (dict(policy="offload_all", store=object()), "must be a systems.ssdtrain Store"),
        (
            dict(policy="offload_all", store=HostStore(), layers=[model.model.layers]),
            "layers lists a ModuleList, which has no forward of its own",
        ),
        (dict(policy=lambda: KEEP), "a callable policy is called with a block's index"),
        (dict(policy=lambda i, j: KEEP), "<lambda> cannot take one argument"),
    ]
    for args, message in cases:
        with pytest.raises(UserError, match=re.escape(message)) as err:
            offload(model, **args)
        assert "\n" not in str(err.value)
    with offload(model, policy=functools.partial(lambda i, default: default, default=KEEP)) as session:
        pass  # a callable of one positional argument, however it is made
    assert session.decisions == [KEEP, KEEP]
    with pytest.raises(UserError, match="returned 'maybe' for block 0"), offload(model, policy=lambda i: "maybe"):
        pass
    with pytest.raises(UserError, match="offloads block 0: give offload"), offload(model, policy=lambda i: OFFLOAD):
        pass


# -- warnings -------------------------------------------------------------------------------------
def test_min_bytes_above_every_saved_tensor_warns_once_in_one_line():
    model, loss_of = make("qwen3")
    with pytest.warns(UserWarning) as caught, offload(model, store=HostStore()) as session:
        for i in range(2):
            loss_of(i).backward()
    assert session.stats.total.offloaded_tensors == 0
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "offloaded nothing" in message and "below min_bytes=1048576" in message and "\n" not in message


def test_warnings_point_at_the_user_s_line_not_at_torch_or_the_library():
    """Warned from a hook in backward (min_bytes above every tensor), from the with block's set-up
    (keep_last covering every block) and from a block's forward hook (blocks out of forward
    order): each warning's file is the caller's, this test's."""
    model = ThreeBlocks()
    x = torch.randn(17, 40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with offload(model, store=HostStore()):  # min_bytes 1 MiB: nothing this small moves
            model(x).backward()
        with offload(model, store=HostStore(), keep_last=3, min_bytes=0):
            model(x).backward()
        with offload(model, store=HostStore(), layers=list(model.blocks)[::-1], min_bytes=0):
            model(x).backward()
        # Planned at a step's exit, through contextlib's ExitStack; one with block per step.
        session = offload(model, store=HostStore(), policy="offload_adaptive", bandwidth=1.0, min_bytes=0)
        for _ in range(2):
            with session:
                model(x).backward()
        # A Hugging Face model: transformers' forward calls the blocks.
        hf, loss_of = make("qwen3")
        with offload(hf, store=HostStore(), layers=list(hf.model.layers)[::-1], min_bytes=0):
            loss_of(0).backward()
    said = [(str(w.message), w.filename) for w in caught if "SSDTrain" in str(w.message)]
    assert {filename for _, filename in said} == {__file__}, said
    for expected in ("offloaded nothing", "offloads nothing: keep_last", "offload_adaptive offloads nothing"):
        assert any(expected in message for message, _ in said), (expected, said)
    assert sum("not in forward order" in message for message, _ in said) == 2, said  # ThreeBlocks', Qwen3's


def test_saved_tensors_a_store_cannot_take_are_not_blamed_on_min_bytes():
    """Meta tensors (no storage to hand to a store) of 1 MiB with min_bytes=0: nothing moves, and
    the warning said "below min_bytes=0 (the largest is 1048576 B)"."""
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Sequential(nn.Linear(512, 512), nn.Tanh()) for _ in range(3)))
    with pytest.warns(UserWarning) as caught, offload(model, store=HostStore(), min_bytes=0) as session:
        model(torch.randn(512, 512, device="meta")).sum().backward()
    assert session.stats.total.offloaded_tensors == 0
    said = [str(w.message) for w in caught if "offloaded nothing" in str(w.message)]
    assert len(said) == 1 and "no tensor a store can take" in said[0] and "min_bytes" not in said[0], said


@pytest.mark.parametrize("policy", ["offload_adaptive", "planner"])
def test_a_planned_policy_whose_min_bytes_is_above_every_saved_storage_says_so(policy):
    """Its first forward keeps every block while it profiles: the check at that backward found
    nothing planned to offload, and the planned steps after it offloaded nothing silently, in a
    ``with`` around the whole loop as in one per step."""
    model = ThreeBlocks()
    planned = {"budget": 0.5} if policy == "planner" else {"bandwidth": 1e12}
    with pytest.warns(UserWarning) as caught, offload(model, store=HostStore(), policy=policy, **planned) as session:
        for _ in range(3):
            model(torch.randn(6, 40)).backward()
    messages = [str(w.message) for w in caught]
    assert session.stats.total.offloaded_tensors == 0
    assert f"SSDTrain {policy}: every storage the profiled step's blocks saved is below min_bytes=1048576" in " ".join(
        messages
    )
    if OFFLOAD in session.decisions:  # a plan that offloads: the step that ran it says it moved nothing
        assert any(m.startswith("SSDTrain offloaded nothing in this forward") for m in messages), messages
    assert all("\n" not in m for m in messages)


class Bottlenecks(nn.Module):
    """Blocks that save storages on both sides of min_bytes=10_000 at 17 rows: their input and
    output (17 x 256 float32, 17,408 B) and their narrow middle (17 x 64, 4,352 B)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 64), nn.Tanh(), nn.Linear(64, 256), nn.Tanh()) for _ in range(4)
        )

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x.square().mean()


def test_the_plan_counts_storages_below_min_bytes_as_held_whatever_it_decides():
    """The planner predicted what the blocks hold from every saved storage, as if those below
    min_bytes could be offloaded: a plan that offloads then held more than it predicted."""
    model = Bottlenecks()
    session = offload(model, store=HostStore(), policy="planner", budget=0.5, bandwidth=1e12, min_bytes=10_000)
    for _ in range(3):  # one step each: the stats are the last step's
        with session:
            model(torch.randn(17, 256)).backward()
    predicted, held = session.plan.predicted_activation_bytes, session.stats.total.kept_bytes
    small = sum(s.unoffloadable_bytes for layer, s in session.stats.layers.items() if layer is not None)
    assert OFFLOAD in session.decisions and small > 0, session.decisions
    assert held <= predicted, (session.decisions, held, predicted)


class _BlocksUnderNoGrad(nn.Module):
    """Trainable blocks run as a frozen feature extractor, a head trained on their output."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(40, 40), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(40, 1)

    def forward(self, x):
        with torch.no_grad():
            for block in self.blocks:
                x = x + block(x)
        return self.head(x).mean()


def test_blocks_run_under_no_grad_are_named_as_the_reason_nothing_was_offloaded():
    """The warning blamed another saved-tensor hook."""
    model = _BlocksUnderNoGrad()
    with pytest.warns(UserWarning) as caught, offload(model, store=HostStore(), min_bytes=0, keep_last=0):
        model(torch.randn(6, 40)).backward()
    assert [str(w.message) for w in caught] == [
        "SSDTrain offloaded nothing in this forward: the blocks ran with gradients off (torch.no_grad or "
        "inference_mode), so autograd saved nothing in them"
    ]


def test_an_empty_batch_warns_that_the_saved_storages_are_empty_not_that_min_bytes_is_too_high():
    model = ThreeBlocks()
    with pytest.warns(UserWarning) as caught, offload(model, store=HostStore(), min_bytes=0) as session:
        loss = model(torch.randn(0, 40))
        loss.backward() if loss.requires_grad else None
    assert session.stats.total.offloaded_tensors == 0
    message = " ".join(str(w.message) for w in caught)
    assert "is empty (0 B" in message and "lower min_bytes" not in message


@pytest.mark.parametrize("policy", ["offload_adaptive", "planner"])
def test_a_plan_profiled_on_an_empty_batch_says_so_once(policy):
    """The profiled step is the first: on a batch of 0 rows every block saves empty tensors, and
    the plan made from it would hold for the whole block without a word."""
    model = ThreeBlocks()
    planned = {"budget": 0.5} if policy == "planner" else {}
    with pytest.warns(UserWarning) as caught, offload(model, store=HostStore(), policy=policy, **planned):
        for rows in (0, 6, 6):
            loss = model(torch.randn(rows, 40))
            loss.backward() if loss.requires_grad else None
    said = [str(w.message) for w in caught if "profiled step's blocks saved was empty" in str(w.message)]
    assert len(said) == 1 and said[0].startswith(f"SSDTrain {policy}: every storage") and "\n" not in said[0]
    with warnings.catch_warnings():  # a real batch profiled: no such warning
        warnings.simplefilter("error")
        with offload(model, store=HostStore(), policy=policy, min_bytes=0, **planned):
            for _ in range(2):
                model(torch.randn(6, 40)).backward()


@pytest.mark.parametrize("outer", ["offload_adaptive", "planner"])
def test_a_planned_block_around_another_that_takes_every_tensor_says_it_planned_nothing(outer):
    model = ThreeBlocks()
    planned = {"budget": 0.5} if outer == "planner" else {}
    with pytest.warns(UserWarning, match=f"SSDTrain {outer}: the blocks ran with gradients but saved no tensor"):
        with offload(model, store=HostStore(), policy=outer, min_bytes=0, **planned) as session:
            with offload(model, store=HostStore(), policy="offload_all", min_bytes=0):
                for _ in range(2):
                    model(torch.randn(5, 40)).backward()
    assert session.decisions is None


class ThreeBlocks(nn.Module):
    def __init__(self, dim: int = 40):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim), nn.Tanh()) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x.square().mean()


def run_steps(model, session, steps: int = 2, reentrant: bool = False):
    x = torch.randn(17, 40, generator=torch.Generator().manual_seed(3))
    with session:
        for _ in range(steps):
            if reentrant:  # as a model whose embeddings feed the blocks: their input needs grad
                h = x.clone().requires_grad_()
                for block in model.blocks:
                    h = h + torch.utils.checkpoint.checkpoint(block, h, use_reentrant=True)
                h.square().mean().backward()
            else:
                model(x).backward()
    return session


@pytest.mark.parametrize(
    "policy, keep_last, decisions",
    [
        ("offload_all", 1, [OFFLOAD, OFFLOAD, KEEP]),
        ("offload_all", 2, [OFFLOAD, KEEP, KEEP]),
        (lambda i: OFFLOAD, 1, [OFFLOAD, OFFLOAD, KEEP]),
        (lambda i: OFFLOAD, 0, [OFFLOAD, OFFLOAD, OFFLOAD]),
        (lambda i: [RECOMPUTE, OFFLOAD, RECOMPUTE][i], 1, [RECOMPUTE, OFFLOAD, RECOMPUTE]),
    ],
)
def test_decisions_say_what_each_block_does_with_keep_last_applied(policy, keep_last, decisions):
    model = ThreeBlocks()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session = run_steps(model, offload(model, store=HostStore(), policy=policy, keep_last=keep_last, min_bytes=0))
    assert session.decisions == decisions
    for index, decision in enumerate(decisions):
        offloaded = session.stats.layers[index].offloaded_bytes if index in session.stats.layers else 0
        assert (offloaded > 0) == (decision == OFFLOAD), (index, decision, offloaded)


class TwoStacks(nn.Module):
    """A model whose first stack is also a model of its own (``a``), to be offloaded by itself."""

    def __init__(self):
        super().__init__()
        self.a, self.b = ThreeBlocks(), ThreeBlocks()

    def forward(self, x):
        return self.a(x) + self.b(x)


def test_an_offloader_whose_tensors_a_later_hook_took_warns_that_it_offloaded_nothing():
    """offload() on a submodule, entered before an offload() of the whole model: the later one's
    saved-tensor hooks take every tensor, the first's blocks decide to offload and get none."""
    model = TwoStacks()
    x = torch.randn(17, 40, generator=torch.Generator().manual_seed(3))
    inner = offload(model.a, store=HostStore(), policy="offload_all", min_bytes=0, keep_last=0)
    outer = offload(model, policy="recompute")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with inner, outer:
            model(x).backward()
    messages = [str(w.message) for w in caught]
    assert inner.stats.total.offloaded_bytes == 0
    assert any("none of their saved tensors reached this offloader" in m for m in messages), messages
    # Alone it offloads and says nothing; an evaluation alone saves nothing, and is no cause to warn.
    alone = offload(model.a, store=HostStore(), policy="offload_all", min_bytes=0, keep_last=0)
    evaluating = offload(model.a, store=HostStore(), policy="offload_all", min_bytes=0, keep_last=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with alone:
            model(x).backward()
        with evaluating, torch.no_grad():
            model(x)
    assert alone.stats.total.offloaded_bytes > 0


@pytest.mark.parametrize("keep_last", [3, 7])
def test_keep_last_covering_every_block_warns_that_nothing_is_offloaded(keep_last):
    model = ThreeBlocks()
    with pytest.warns(UserWarning) as caught:
        session = run_steps(model, offload(model, store=HostStore(), keep_last=keep_last, min_bytes=0))
    assert session.decisions == [KEEP] * 3 and session.stats.total.offloaded_tensors == 0
    messages = [str(w.message) for w in caught]
    assert any(f"keep_last={keep_last} keeps the last 3 of the model's 3 blocks" in m for m in messages), messages
    assert all("\n" not in m for m in messages)


def test_offload_adaptive_whose_keep_last_covers_every_block_warns_and_the_planner_recomputes_quietly():
    """One block shared by every position (ALBERT's) is one block: the default keep_last=1 keeps
    it, and offload_adaptive offloaded nothing without a word. The planner may still recompute
    it: no warning there."""
    model = ThreeBlocks()
    with pytest.warns(UserWarning) as caught:
        session = run_steps(
            model, offload(model, store=HostStore(), policy="offload_adaptive", keep_last=3, min_bytes=0)
        )
    assert OFFLOAD not in session.decisions and session.stats.total.offloaded_tensors == 0
    said = [str(w.message) for w in caught if "keeps every one of the model's 3 blocks" in str(w.message)]
    assert len(said) == 1 and "offload_adaptive offloads nothing" in said[0], [str(w.message) for w in caught]
    assert not [w for w in caught if "first block's writes" in str(w.message)]  # keep_last is the reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_steps(model, offload(model, store=HostStore(), policy="planner", budget=0.5, keep_last=3, min_bytes=0))
    assert not [w for w in caught if "keeps every one" in str(w.message)]


def test_offload_adaptive_whose_store_is_too_slow_for_any_block_says_so():
    """A store too slow for the first block's writes to end within forward: the adaptive plan
    keeps every block, and says why (it had said nothing, and saved nothing)."""
    model = ThreeBlocks()
    with pytest.warns(
        UserWarning, match=r"offload_adaptive offloads nothing: the first block's writes \(\d+ B at"
    ) as caught:
        session = run_steps(
            model, offload(model, store=HostStore(), policy="offload_adaptive", bandwidth=1.0, min_bytes=0)
        )
    assert session.decisions == [KEEP] * 3 and session.stats.total.offloaded_tensors == 0
    assert all("\n" not in str(w.message) for w in caught)
    with warnings.catch_warnings(record=True) as caught:  # a store fast enough: it offloads, quietly
        warnings.simplefilter("always")
        session = run_steps(
            model, offload(model, store=HostStore(), policy="offload_adaptive", bandwidth=1e15, min_bytes=0)
        )
    assert OFFLOAD in session.decisions and not [w for w in caught if "offloads nothing" in str(w.message)]


def test_blocks_given_out_of_forward_order_warn_once_and_train_as_without_offloading():
    """keep_last and prefetch follow the list's order: a list in another order than forward's keeps
    and reads back the wrong blocks first. It is said once (naming the blocks); the gradients stay
    exact. A block that runs again later in forward (a shared one) is no disorder."""
    reference = ThreeBlocks()
    model = ThreeBlocks()
    model.load_state_dict(reference.state_dict())
    run_steps(reference, contextlib.nullcontext(), steps=2)
    backwards = list(model.blocks)[::-1]
    with pytest.warns(UserWarning) as caught:
        run_steps(model, offload(model, store=HostStore(), layers=backwards, min_bytes=0), steps=2)
    said = [str(w.message) for w in caught if "not in forward order" in str(w.message)]
    assert said == [
        "SSDTrain: the blocks are not in forward order: block 1 (blocks.1) first ran after block 2 (blocks.0); "
        "keep_last and prefetch follow the list's order, so the blocks kept and read back first are not the last "
        "to run: pass layers= in the order forward calls them"
    ]
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine.grad, theirs.grad)
    # A forward that skips a block (LayerDrop), then another before backward: in order both times.
    dropping = ThreeBlocks()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with offload(dropping, store=HostStore(), min_bytes=0):
            y = torch.randn(17, 40)
            skipped = y + dropping.blocks[0](y)
            skipped = skipped + dropping.blocks[2](skipped)
            (skipped.square().mean() + dropping(y)).backward()
    assert not [w for w in caught if "forward order" in str(w.message)]
    shared = ThreeBlocks()
    shared.blocks = nn.ModuleList([shared.blocks[0]] * 3)  # one block at every position
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_steps(shared, offload(shared, store=HostStore(), layers=[shared.blocks[0]], keep_last=0, min_bytes=0))
        run_steps(model, offload(model, store=HostStore(), layers=list(model.blocks), min_bytes=0))
    assert not [w for w in caught if "forward order" in str(w.message)]


def test_the_planners_store_traffic_is_training_s_only(monkeypatch):
    """The bandwidth probe the planner runs inside the block is not counted as training's. The
    probe writes through the store as ever; it reports a store fast enough that the plan offloads,
    whatever this machine's speed."""
    from systems.ssdtrain import planning

    probe = planning.store_bandwidth
    monkeypatch.setattr(planning, "store_bandwidth", lambda *args, **kwargs: probe(*args, **kwargs) * 0 + 1e15)
    model = ThreeBlocks()
    session = run_steps(model, offload(model, store=HostStore(), policy="planner", budget=0.5, min_bytes=0))
    assert session.stats.store.bytes_written < session.offloader.store.counters.bytes_written  # the probe wrote
    assert OFFLOAD in session.decisions
    offloaded = sum(layer.offloaded_bytes for layer in session.stats.layers.values())
    assert session.stats.store.bytes_written == offloaded > 0


@pytest.mark.parametrize("policy", ["planner", "offload_adaptive"])
def test_the_plan_is_made_for_the_prefetch_the_engine_runs_with(policy, monkeypatch):
    """The cost model timed read-backs one block ahead whatever offload() was given: a plan for
    prefetch=0 or 3 predicted another step than the one that ran."""
    from systems.ssdtrain import planning

    asked = []
    for name in ("plan", "adaptive"):
        made = getattr(planning, name)
        monkeypatch.setattr(planning, name, lambda *a, made=made, **k: asked.append(k["prefetch"]) or made(*a, **k))
    for prefetch in (0, 3):
        model = ThreeBlocks()
        budget = {"budget": 0.5} if policy == "planner" else {}
        run_steps(model, offload(model, store=HostStore(), policy=policy, min_bytes=0, prefetch=prefetch, **budget))
    assert asked == [0, 3]


def test_a_plan_run_at_another_prefetch_than_it_was_made_for_warns():
    """A plan records the prefetch its step and peak were predicted for; reused with another, its
    decisions still apply, and the user is told the prediction is another engine's."""
    model = ThreeBlocks()
    session = run_steps(
        model, offload(model, store=HostStore(), policy="planner", budget=0.5, bandwidth=1e15, min_bytes=0, prefetch=2)
    )
    plan = session.plan
    assert plan.prefetch == 2 and plan.offloaded > 0
    with pytest.warns(UserWarning, match=r"made for prefetch=2 and offload\(\) runs prefetch=1: .*pass prefetch=2"):
        again = offload(model, store=HostStore(), policy=plan, min_bytes=0)
    assert again.decisions == list(plan.decisions)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        offload(model, store=HostStore(), policy=plan, min_bytes=0, prefetch=2)  # as made: silent
        offload(model, store=HostStore(), policy=Plan(plan.decisions, 0.0, 0, 0.0), min_bytes=0)  # by hand: no claim
        offload(model, policy=Plan((KEEP, RECOMPUTE, KEEP), 0.0, 0, 0.0, prefetch=2))  # offloads nothing


def test_a_budget_no_plan_fits_warns_and_holds_the_least():
    model = ThreeBlocks()
    with pytest.warns(UserWarning, match=r"no plan fits budget=0.01 \(\d+ B of activations\)") as caught:
        session = run_steps(model, offload(model, policy="planner", budget=0.01, bandwidth=1.0, store=HostStore()))
    assert session.plan.predicted_activation_bytes > session.plan.budget_bytes
    assert session.decisions == [RECOMPUTE] * 3
    assert all("\n" not in str(w.message) for w in caught)


@pytest.mark.parametrize("policy", ["planner", "offload_adaptive"])
def test_a_new_planned_offload_each_step_is_warned_of_and_one_reused_is_not(policy):
    """One offload() per step profiled a step keeping everything and planned for a step that never
    came, every step, while ``decisions`` showed the plan: nothing was ever offloaded or recomputed.
    Two planners taking turns, or one made anew after a failed step, run their plans: no warning."""
    budget = {"budget": 0.3} if policy == "planner" else {}

    def made(model, **change):
        return offload(model, policy=policy, bandwidth=1e9, store=HostStore(), min_bytes=0, **(budget | change))

    def warned(steps) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for session, model in steps:
                run_steps(model, session, steps=1)
        return [str(w.message) for w in caught if "neither plan ran" in str(w.message)]

    model = ThreeBlocks()
    kept_by_keep = run_steps(model, offload(model, policy="keep", min_bytes=0), steps=1).stats.total.kept_bytes
    reused = made(model)
    assert not warned([(reused, model)] * 3 + [(made(model), model), (made(model), model)])
    assert reused.stats.total.kept_bytes < kept_by_keep  # its plan ran
    if policy == "planner":  # two planners at two budgets taking turns, each entered once per step
        model = ThreeBlocks()
        low, high = made(model, budget=0.2), made(model, budget=0.8)
        assert not warned([(low, model), (high, model)] * 3)
    model = ThreeBlocks()
    first = run_steps(model, made(model), steps=1)
    assert first.decisions is not None and first.stats.total.kept_bytes == kept_by_keep
    messages = warned([(made(model), model), (made(model), model)])  # the second and third made anew
    assert len(messages) == 1 and re.fullmatch(
        rf"SSDTrain {policy}: the last two offload\(\) objects on this model planned at their block's end, and "
        r"neither plan ran: .* Make offload\(\) once, before the loop, and enter it at every step",
        messages[0],
    )


def test_blocks_run_by_a_reentrant_checkpoint_are_named_as_the_reason_a_plan_cannot_be_made():
    model = ThreeBlocks()
    with pytest.raises(UserError, match="ran with gradients.*reentrant checkpoint.*use_reentrant=False"):
        run_steps(model, offload(model, policy="planner", budget=0.5, store=HostStore()), reentrant=True)


class CallerCheckpointed(ThreeBlocks):
    """Blocks the model's own forward runs through ``torch.utils.checkpoint`` (non-reentrant), as
    nanoGPT-style code does: the checkpoint's hooks take what the blocks save."""

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return x.square().mean()


def test_blocks_checkpointed_by_their_caller_are_named_as_why_nothing_is_offloaded():
    model = CallerCheckpointed()
    want = [p.grad for p in _grads_of(copy.deepcopy(model))]
    with pytest.warns(UserWarning, match=r"offloaded nothing.*inside a torch\.utils\.checkpoint their caller runs"):
        session = run_steps(model, offload(model, policy="offload_all", store=HostStore(), min_bytes=0, keep_last=0))
    assert session.offloader.checkpointed_by_caller == {0, 1, 2} and session.stats.total.offloaded_tensors == 0
    assert all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want, strict=True))  # still right


@pytest.mark.parametrize("policy, budget", [("planner", 0.5), ("offload_adaptive", None)])
@pytest.mark.parametrize("keep_last", [0, 1])
def test_blocks_checkpointed_by_their_caller_are_refused_in_one_line_by_the_planned_policies(policy, budget, keep_last):
    model = CallerCheckpointed()
    session = offload(model, policy=policy, budget=budget, store=HostStore(), min_bytes=0, keep_last=keep_last)
    with pytest.raises(UserError, match=rf"{policy} cannot plan: the blocks ran inside a torch\.utils\.checkpoint"):
        run_steps(model, session, steps=3)


class SomeCheckpointed(ThreeBlocks):
    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = x + (torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if i == 1 else block(x))
        return x.square().mean()


@pytest.mark.parametrize("policy, budget", [("planner", 0.5), ("offload_adaptive", None)])
def test_a_plan_leaves_the_blocks_their_caller_checkpoints_to_it_and_plans_the_others(policy, budget):
    model = SomeCheckpointed()
    want = [p.grad for p in _grads_of(copy.deepcopy(model), steps=3)]
    session = offload(model, policy=policy, budget=budget, store=HostStore(), min_bytes=0, keep_last=0)
    with pytest.warns(UserWarning, match=rf"{policy}: blocks 1 ran inside a torch\.utils\.checkpoint their caller"):
        run_steps(model, session, steps=3)
    assert session.offloader.checkpointed_by_caller == {1} and session.decisions is not None
    assert all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want, strict=True))


def test_blocks_the_model_calls_directly_are_not_taken_for_checkpointed_ones():
    model = ThreeBlocks()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        session = run_steps(model, offload(model, policy="offload_all", store=HostStore(), min_bytes=0, keep_last=0))
    assert not session.offloader.checkpointed_by_caller and session.stats.total.offloaded_tensors > 0


def _grads_of(model, steps: int = 2) -> list[torch.nn.Parameter]:
    run_steps(model, contextlib.nullcontext(), steps=steps)
    return list(model.parameters())


class Meanwhile(nn.Module):
    """A block that, while it runs, has another thread run ``evaluate`` (the whole model under
    no_grad, as a monitoring thread's evaluation) and waits for it: the interleaving a race could
    produce, made certain."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block, self.evaluate = block, None

    def forward(self, x):
        if self.evaluate is not None and torch.is_grad_enabled():
            thread = threading.Thread(target=self.evaluate)
            thread.start()
            thread.join()
        return self.block(x)


@pytest.mark.parametrize("policy", ["offload_all", "planner"])
def test_another_thread_s_forward_meanwhile_leaves_the_block_s_bookkeeping_alone(policy):
    def run(monitored: bool):
        torch.manual_seed(0)
        model = ThreeBlocks()
        for i, block in enumerate(model.blocks):
            model.blocks[i] = Meanwhile(block)
        if monitored:

            def evaluate():
                with torch.no_grad():
                    model(torch.randn(3, 40))

            model.blocks[1].evaluate = evaluate
        args = dict(budget=0.5) if policy == "planner" else dict(keep_last=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # no "not in forward order", no "offloaded nothing"
            session = run_steps(model, offload(model, policy=policy, store=HostStore(), min_bytes=0, **args), steps=3)
        return [p.grad for p in model.parameters()], session

    want, alone = run(monitored=False)
    got, session = run(monitored=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert session.decisions == alone.decisions
    assert session.stats.total.offloaded_tensors == alone.stats.total.offloaded_tensors > 0


def test_a_forward_run_only_on_another_thread_says_so_in_one_line():
    model = ThreeBlocks()
    x = torch.randn(5, 40)
    with pytest.warns(UserWarning, match="ran on another thread than the one that entered") as caught:
        with offload(model, policy="offload_all", store=HostStore(), min_bytes=0, keep_last=0) as session:
            thread = threading.Thread(target=lambda: model(x).backward())
            thread.start()
            thread.join()
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert session.stats.total.offloaded_tensors == 0


class ListWithForward(nn.ModuleList):
    def forward(self, x):
        for block in self:
            x = x + block(x)
        return x


def test_a_module_list_with_a_forward_of_its_own_is_a_block():
    model = ThreeBlocks()
    model.blocks = nn.ModuleList(ListWithForward([nn.Linear(40, 40), nn.Tanh()]) for _ in range(3))
    with offload(
        model, policy="offload_all", store=HostStore(), min_bytes=0, keep_last=0, layers=list(model.blocks)
    ) as s:
        model(torch.randn(5, 40)).backward()
    assert s.stats.total.offloaded_tensors > 0


class OldStyleCheckpointedBlock(nn.Module):
    """A block checkpointed the way Hugging Face's GradientCheckpointingLayer did before it moved the
    checkpoint inside ``forward``: around the whole call, so the block's forward hooks run inside
    the checkpoint, after it has saved the block's input."""

    gradient_checkpointing = True

    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 3 * dim), nn.Linear(3 * dim, dim)
        self._gradient_checkpointing_func = torch.utils.checkpoint.checkpoint

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))

    def __call__(self, *args):
        return self._gradient_checkpointing_func(super().__call__, *args, use_reentrant=False)


class OldStyleStack(nn.Module):
    def __init__(self, dim: int = 24, blocks: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(OldStyleCheckpointedBlock(dim) for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


@pytest.mark.parametrize("style", ["transformers", "checkpoint around the call"])
def test_hugging_face_gradient_checkpointing_is_composed_with(style):
    """What Hugging Face's checkpoints save (each block's input) is offloaded, bit-identically, and
    the recompute policy does not checkpoint a checkpointed block again."""

    def model_and_loss():
        torch.manual_seed(0)
        if style == "transformers":
            model = qwen3(3)
            model.train()
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            ids = torch.randint(0, 96, (3, 19), generator=torch.Generator().manual_seed(1))
            return model, lambda: model(input_ids=ids, labels=ids).loss
        model = OldStyleStack()
        x = torch.randn(5, 24, generator=torch.Generator().manual_seed(1))
        return model, lambda: model(x)

    def run(**args):
        model, loss_of = model_and_loss()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing_enable's new name
            warnings.simplefilter("error", UserWarning)
            with offload(model, **args) as session:
                loss = loss_of()
                loss.backward()
        return loss, [p.grad for p in model.parameters()], session

    want_loss, want_grads, _ = run(policy="keep")
    for args in (dict(store=HostStore(), min_bytes=0, keep_last=0), dict(policy="recompute")):
        loss, grads, session = run(**args)
        assert torch.equal(loss, want_loss) and all(torch.equal(a, b) for a, b in zip(grads, want_grads))
        blocks = len(session.layers)
        if "store" in args:
            assert sorted(k for k in session.stats.layers if k is not None) == list(range(blocks))
            assert all(session.stats.layers[i].offloaded_tensors >= 1 for i in range(blocks))
        else:
            assert all("forward" not in vars(b) for b in session.layers)


def test_what_a_hugging_face_reentrant_checkpoint_recomputes_belongs_to_its_layer():
    """Hugging Face checkpoints a layer's forward, its hooks outside: the recomputation in backward
    ran no hook of the layer's, and the tensors it saved were counted as saved outside the layers
    (a planner's base of bytes it cannot reduce, several times too large)."""

    def run(reentrant: bool, **args):
        torch.manual_seed(0)
        model = qwen3(2)
        model.train()
        ids = torch.randint(0, 96, (3, 19), generator=torch.Generator().manual_seed(1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            with offload(model, **args) as session:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
        return loss, [p.grad for p in model.parameters()], session

    want_loss, want_grads, plain = run(False, policy="keep")
    for args in (dict(policy="keep"), dict(store=HostStore(), min_bytes=0, keep_last=0)):
        loss, grads, session = run(True, **args)
        assert torch.equal(loss, want_loss) and all(torch.equal(a, b) for a, b in zip(grads, want_grads))
        outside = session.stats.layers[None]
        assert (outside.packed_tensors, outside.packed_bytes) == (
            plain.stats.layers[None].packed_tensors,
            plain.stats.layers[None].packed_bytes,
        )
        assert all(session.stats.layers[i].packed_tensors > 1 for i in range(len(session.layers)))


def checkpointed_qwen3(reentrant: bool) -> nn.Module:
    """A two-layer Qwen3 in training mode with Hugging Face's gradient checkpointing on."""
    torch.manual_seed(0)
    model = qwen3(2)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing_enable's new name
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return model


def test_after_a_checkpointed_call_what_is_saved_is_outside_the_layer_again():
    """The wrapper puts the layer back as it found it: a tensor saved after the checkpointed call
    returns is not the layer's (it would be offloaded or counted as the layer's)."""
    model = checkpointed_qwen3(reentrant=False)
    with offload(model, policy="keep") as session:
        checkpointed = session.layers[0]._gradient_checkpointing_func
        x = torch.randn(3, 5, requires_grad=True, generator=torch.Generator().manual_seed(2))
        y = checkpointed(lambda t: t.sin(), x, use_reentrant=False)
        inside = session.stats.layers[0].packed_tensors
        loss = y.exp().sum()  # exp saves its output: outside every layer
        assert session.stats.layers[0].packed_tensors == inside
        assert session.stats.layers[None].packed_tensors == 1
        loss.backward()
    assert torch.allclose(x.grad, (x.sin().exp() * x.cos()))


def test_a_checkpointed_call_starts_the_puts_it_deferred_when_it_returns():
    """A reentrant checkpoint saves its inputs after the layer's forward hooks have run; an input
    without autograd history is offloaded with a deferred put (its op may still be filling it).
    The wrapper starts that put when the call returns: nothing else would before backward, and
    the tensor would stay in device memory through the rest of forward."""
    model = checkpointed_qwen3(reentrant=True)
    store = Recording()
    with offload(model, store=store, min_bytes=0, keep_last=0) as session:
        checkpointed = session.layers[-1]._gradient_checkpointing_func
        constant = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))  # no history: deferred
        weight = torch.randn(3, 5, requires_grad=True, generator=torch.Generator().manual_seed(3))
        y = checkpointed(lambda c, w: (c * w).sin(), constant, weight, use_reentrant=True)
        assert sorted(store.stored) == [constant.nbytes, weight.nbytes], "the deferred put did not start"
        y.square().sum().backward()
    assert torch.allclose(weight.grad, 2 * (constant * weight).sin() * (constant * weight).cos() * constant)


# -- prefetch, autocast ---------------------------------------------------------------------------
def test_every_backward_of_a_block_prefetches_its_read_backs():
    """Two micro-batches of gradient accumulation in one block: on the CPU a host store's write ends
    at once, so every offloaded tensor is read back, and each read must have been started ahead by
    prefetch, never by a backward that found it missing."""
    model, loss_of = make("qwen3")
    offloader = Offloader(model, HostStore(), min_bytes=0, keep_last=0)
    with offloader:
        for i in range(MICRO_BATCHES):
            loss_of(i).backward()
    stats = offloader.stats
    assert stats.total.offloaded_tensors > 0 and stats.store.tensors_stored == stats.total.offloaded_tensors
    assert (stats.prefetched_loads, stats.demand_loads) == (stats.total.offloaded_tensors, 0)
    assert offloader.backwards == MICRO_BATCHES


class Recording(HostStore):
    def __init__(self):
        super().__init__()
        self.stored = []  # the bytes of each tensor put

    def _put(self, key, src, ready):
        self.stored.append(src.numel() * src.element_size())
        return super()._put(key, src, ready)


def test_weight_casts_under_autocast_are_never_offloaded():
    """Under CPU autocast every matrix multiply saves a bfloat16 cast of its weight; none goes to the
    store. (No activation of this model has a weight's size: 57 tokens by 48, 80 or 96.)"""
    store = Recording()
    sessions = []

    def session(model):
        sessions.append(offload(model, store=store, min_bytes=0, keep_last=0))
        return sessions[-1]

    got = train("qwen3", session, autocast=True)
    assert_identical(got, reference("qwen3", autocast=True))
    weights = [p for p in qwen3().parameters() if p.dim() == 2]
    cast_bytes = {p.numel() * torch.bfloat16.itemsize for p in weights}
    assert store.stored, "nothing was offloaded: the test would test nothing"
    assert [n for n in store.stored if n in cast_bytes] == []
    assert sessions[0].stats.total.parameter_bytes >= sum(cast_bytes)


# -- the documented example -----------------------------------------------------------------------
def test_the_worked_example_of_the_docs_runs_as_written():
    text = DOC.read_text()
    start = text.index("## Applying it to a model of one's own")
    block = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert block, "the docs' worked example has no python block"
    namespace = {}
    exec(compile(block.group(1), str(DOC), "exec"), namespace)
    assert namespace["offloaded"] > 0 and namespace["waits"] == 0


# -- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["offload_all", "recompute", "save_on_cpu", "offload_adaptive"])
def test_gpu_policies_under_autocast_match_keep_and_never_offload_a_weight_cast(policy):
    """On a GPU with bf16 autocast (eager attention and deterministic kernels, so that two runs
    without hooks agree): losses and gradients bit-identical to no hooks, and the pinned host store
    never given a tensor of a weight's bf16 size."""
    torch.use_deterministic_algorithms(True)
    try:

        def run(session=None):
            torch.manual_seed(0)
            model = qwen3(3, attention="eager").cuda()
            model.train()
            ids = torch.randint(0, 96, (3, 19), generator=torch.Generator().manual_seed(1)).cuda()
            block = session(model) if session else contextlib.nullcontext()
            losses = []
            with block:
                for _ in range(2):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
                    losses.append(loss.detach())
            return losses, [p.grad.clone() for p in model.parameters()], model

        want_losses, want_grads, model = run()
        store = Recording()
        args = policy_args(policy, 3) | ({"store": store} if "store" in policy_args(policy, 3) else {})
        losses, grads, _ = run(lambda m: offload(m, **args))
        assert all(torch.equal(a, b) for a, b in zip(losses, want_losses))
        assert all(torch.equal(a, b) for a, b in zip(grads, want_grads))
        cast_bytes = {p.numel() * 2 for p in model.parameters() if p.dim() == 2}
        assert [n for n in store.stored if n in cast_bytes] == []
    finally:
        torch.use_deterministic_algorithms(False)
