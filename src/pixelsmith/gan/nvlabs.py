"""NVlabs' StyleGAN2 network pickles read as data, never run, and mapped onto Pixelsmith's StyleGAN2.

A stylegan2-ada-pytorch (or stylegan3, `--cfg=stylegan2`) snapshot is a pickle of a dict {'G', 'D', 'G_ema',
'augment_pipe', 'training_set_kwargs', ...}. Each network is a `torch_utils.persistence` object: unpickling calls
`_reconstruct_persistent_obj(meta)`, which in NVlabs' code *executes* `meta['module_src']` (the source the pickle
carries) and builds the class from it. Here that call only returns a `PersistentObject` holding the class name,
the source text (never executed) and the module's `__dict__` (`_parameters`, `_buffers`, `_modules`,
`_init_kwargs`).

The reader is not `pickle.Unpickler` but a small pickle machine of its own (`_PickleMachine`, over the stdlib's
`pickletools.genops` decoding): it runs only the opcodes listed in `_OPCODES` and knows only the globals listed in
`_GLOBALS`, each with the reason an NVlabs pickle has it, each resolved to a function here that builds plain data.
So nothing a file names is imported or called, and no object's `__setstate__` runs: BUILD is applied only to the
two things NVlabs' snapshots build (a numpy dtype's byte order, an EasyDict's empty state), checked against the one
form they take. Numpy dtypes are the plain numbers in `_NUMPY_NUMBERS`, made here, and a numpy scalar is decoded
here from exactly its item size of bytes. A storage is exactly the bytes the file carries for it (its declared
count checked against its payload; torch's own legacy reader would size it from the count alone) and never grows;
a tensor is a view that must lie inside its storage. Work and memory are bounded: opcodes per file, module depth
and modules per network, tensor dimensions, and all tensors' bytes together (at most the file's own size). Every
failure, whatever raised it, ends as one NVlabsPickleError paragraph.

`convert_pickle(path)` turns the networks into Pixelsmith state dicts plus the `model.generator.*` /
`model.discriminator.*` settings that build the same networks, every setting cast to its type and checked against
a sane range, and refuses an architecture Pixelsmith does not have (StyleGAN3's, a conditional discriminator,
another synthesis or mapping layout), naming what differs. The networks those settings build are first laid out
on the meta device (no memory) and their shapes compared with the pickle's tensors, so a pickle whose settings do
not match its tensors is refused before anything of its size is allocated.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import pickletools
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pixelsmith.errors import PixelsmithError
from pixelsmith.safe_load import UnloadableFileError

NVLABS_REPO = "https://github.com/NVlabs/stylegan2-ada-pytorch"
NETWORK_KEYS = ("G", "D", "G_ema")

# What a file can make the reader do, each far above what NVlabs' largest networks need (a 1024 px snapshot has of
# the order of 10^5 opcodes, a few hundred modules and tensors per network, nested four deep, names of a few
# letters, tensors of at most four dims). Every opcode makes at most one small object, so MAX_OPCODES bounds the
# reader's time and the memory it takes beyond the file's own bytes; names and depth bound each tensor's name.
MAX_OPCODES = (
    2_000_000  # with the opcodes of the pickles inside its storages, and items a builder goes through
)
MAX_MODULE_DEPTH = 16
MAX_MODULES = 10_000  # per network
MAX_MODULE_LINKS = 100_000  # child entries in all of a network's modules
MAX_TENSORS = 50_000  # per network
MAX_NAME = 64  # letters in a parameter's, buffer's or child module's name
MAX_TENSOR_DIMS = 8
MAX_LINE = 256  # a GLOBAL opcode's "module\nname\n" lines


class NVlabsPickleError(UnloadableFileError):
    """A file given as an NVlabs network pickle is not one, needs code to load, or holds an architecture we lack."""


class _Refused(pickle.UnpicklingError):
    """The file asks for something only code does (a global, an opcode, a __setstate__): refused, never run."""


class RefusedGlobal(_Refused):
    def __init__(self, module: str, name: str):
        super().__init__(f"it asks for the global {module}.{name}")
        self.global_name = f"{module}.{name}"


class _Malformed(pickle.UnpicklingError):
    """The file's structure does not add up (a length, offset, count or type no NVlabs pickle has), or it is over
    one of the reader's bounds."""


class _Truncated(_Malformed, EOFError):
    """A read past the end of the file (or of a storage's bytes)."""


@dataclass
class PersistentObject:
    """An NVlabs persistent module as data: what its class was called and the state it pickled. `module_src` is
    kept as text (it tells StyleGAN3's networks apart) and never executed."""

    class_name: str
    module_src: str
    state: dict[str, Any]

    def _group(self, name: str, kinds: tuple[type, ...]) -> dict[str, Any]:
        group = self.state.get(name)
        if group is None:
            return {}
        if type(group) not in (dict, OrderedDict, _EasyDict):
            raise _Malformed(f"module {self.class_name}'s {name} is a {type(group).__name__}, not a dict")
        for key, value in group.items():
            if type(key) is not str or len(key) > MAX_NAME:
                raise _Malformed(f"module {self.class_name}'s {name} has a name that is no short text")
            if not (value is None or isinstance(value, kinds)):
                raise _Malformed(f"module {self.class_name}'s {name} holds a {type(value).__name__}")
        return dict(group)

    @property
    def init_kwargs(self) -> dict[str, Any]:
        kwargs = self.state.get("_init_kwargs")
        if kwargs is not None and type(kwargs) not in (dict, OrderedDict, _EasyDict):
            raise _Malformed(
                f"module {self.class_name}'s _init_kwargs is a {type(kwargs).__name__}, not a dict"
            )
        return dict(kwargs or {})

    @property
    def children(self) -> dict[str, PersistentObject]:
        return {k: v for k, v in self._group("_modules", (PersistentObject,)).items() if v is not None}

    def modules(self) -> list[tuple[str, PersistentObject]]:
        """This module and every module below it, as (name prefix, module), depth first in the pickle's order.
        Each is listed once, under the first name the walk meets it by, as torch's `named_modules` lists a module
        once: a module two parents share, or one that is its own descendant, is not walked again. An explicit
        stack, not recursion, and bounded in depth, modules and child entries looked at."""
        out: list[tuple[str, PersistentObject]] = []
        seen = {id(self)}
        pending: list[tuple[str, PersistentObject, int]] = [("", self, 0)]
        links = 0
        while pending:
            prefix, module, depth = pending.pop()
            if depth > MAX_MODULE_DEPTH:
                raise _Malformed(f"its modules nest more than {MAX_MODULE_DEPTH} deep (at {prefix[:100]}...)")
            out.append((prefix, module))
            if len(out) > MAX_MODULES:
                raise _Malformed(f"a network of more than {MAX_MODULES} modules")
            children = module.children
            links += len(children)
            if links > MAX_MODULE_LINKS:
                raise _Malformed(f"a network whose modules list more than {MAX_MODULE_LINKS} children in all")
            fresh = []
            for name, child in children.items():
                if id(child) not in seen:
                    seen.add(id(child))
                    fresh.append((f"{prefix}{name}.", child, depth + 1))
            pending.extend(reversed(fresh))
        return out

    def tensors(self, prefix: str = "") -> dict[str, Tensor]:
        """Every parameter and buffer, named as NVlabs' `state_dict()` names them (frozen layers keep their weights
        as buffers: they are here too)."""
        out: dict[str, Tensor] = {}
        for name, module in self.modules():
            for group in ("_parameters", "_buffers"):
                for key, tensor in module._group(group, (Tensor,)).items():
                    if tensor is not None:
                        out[f"{prefix}{name}{key}"] = tensor
                if len(out) > MAX_TENSORS:
                    raise _Malformed(f"a network of more than {MAX_TENSORS} tensors")
        return out


class _EasyDict(dict):
    """dnnlib.EasyDict read back as the plain dict it is (attribute access is all it adds)."""


# --------------------------------------------------------------------------------------------------------------------
# What the globals an NVlabs pickle names are built as: plain data, each checked as it is built. Every builder takes
# the machine first (its budget) and the pickle's arguments after.


def _reconstruct_persistent_obj(machine: _PickleMachine, meta: Any) -> PersistentObject:
    if type(meta) is not dict or type(meta.get("state")) is not dict:
        raise _Malformed("a persistent module without its state dict")
    class_name, module_src = meta.get("class_name"), meta.get("module_src")
    if type(class_name) is not str or not (module_src is None or type(module_src) is str):
        raise _Malformed("a persistent module whose class name or source is not text")
    # the state itself, not a copy: a pickle can build many modules from one state it refers back to
    return PersistentObject(class_name[:200], module_src or "", meta["state"])


def _ordered_dict(machine: _PickleMachine, *args: Any) -> OrderedDict:
    if args:  # OrderedDict pickles as OrderedDict() and its items (SETITEMS) after
        raise _Malformed("an OrderedDict built from arguments")
    return OrderedDict()


def _set(machine: _PickleMachine, items: Any = ()) -> set:
    if type(items) is not list:  # protocol 3 pickles a set as builtins.set([items])
        raise _Malformed(f"a set built from a {type(items).__name__}")
    machine.budget.spend("opcodes", len(items))
    return {machine.key(item) for item in items}


def _easy_dict(machine: _PickleMachine, *args: Any) -> _EasyDict:
    if args:
        raise _Malformed("an EasyDict built from arguments")
    return _EasyDict()


@dataclass
class _Storage:
    """A storage's values, as a flat tensor over exactly the bytes the file carried for them (never resized)."""

    flat: Tensor


@dataclass
class _StorageRecord:
    """torch.save's persistent id for a storage: which key its bytes are filed under, and how many values."""

    dtype: torch.dtype
    key: str
    numel: int


# torch.save's legacy format (how torch pickles a storage, `torch.storage._load_from_bytes`): torch.serialization's
# MAGIC_NUMBER and PROTOCOL_VERSION, then the system info, the storage's persistent id, the list of storage keys,
# and per key an int64 count followed by the values' bytes.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


def _load_storage(machine: _PickleMachine, payload: Any) -> _Storage:
    """One storage from the bytes torch pickles it as, read here: torch.load would size it from the counts the
    bytes declare, before seeing whether the bytes are there."""
    if type(payload) is not bytes:
        raise _Malformed(f"a storage given as a {type(payload).__name__}, not bytes")
    machine.budget.spend("storage_bytes", len(payload))
    stream = _BoundedStream(io.BytesIO(payload), len(payload))
    records: list[_StorageRecord] = []

    def header() -> Any:
        return _PickleMachine(stream, _STORAGE_GLOBALS, machine.budget, records.append).load()

    magic, protocol, system = header(), header(), header()
    if (type(magic), type(protocol)) != (int, int) or (magic, protocol) != (_LEGACY_MAGIC, _LEGACY_PROTOCOL):
        raise _Malformed("a storage that is not in torch's storage format")
    if type(system) is not dict or system.get("little_endian") is not True:
        raise _Malformed("a storage written on a big-endian machine")
    stored, keys = header(), header()
    if len(records) != 1 or stored is not records[0] or type(keys) is not list or keys != [records[0].key]:
        raise _Malformed("a storage's bytes holding other than the one storage")
    record = records[0]
    count = int.from_bytes(stream.read(8), "little", signed=True)
    item_size = torch.empty((), dtype=record.dtype).element_size()
    if count != record.numel or stream.remaining != count * item_size:
        raise _Malformed(
            f"a storage declaring {record.numel} values ({count} in its data header) in {stream.remaining} bytes "
            f"of {item_size}-byte values"
        )
    values = bytearray(stream.read(stream.remaining))
    if not values:
        return _Storage(torch.empty(0, dtype=record.dtype))
    if record.dtype == torch.bool:
        # any non-zero byte is True: a bool byte other than 0 or 1 is undefined behaviour in torch
        return _Storage(torch.frombuffer(values, dtype=torch.uint8) != 0)
    return _Storage(torch.frombuffer(values, dtype=record.dtype))


def _storage_record(pid: Any) -> _StorageRecord:
    if not (type(pid) is tuple and len(pid) == 6 and pid[0] == "storage" and type(pid[1]) is torch.dtype):
        raise _Malformed("a persistent id that is no storage")
    _, dtype, key, location, numel, view_metadata = pid
    if type(key) is not str or type(location) is not str or not _is_index(numel) or view_metadata is not None:
        raise _Malformed("a storage record with a malformed key, location, size or view")
    return _StorageRecord(dtype, key, numel)


def _is_index(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**62


def _rebuild_tensor(
    machine: _PickleMachine,
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any = False,
    backward_hooks: Any = None,
    metadata: Any = None,
) -> Tensor:
    """torch._utils._rebuild_tensor_v2, as a view that must lie inside its storage (torch's `set_` would grow a
    storage to fit an offset or size a file declares)."""
    if type(storage) is not _Storage:
        raise _Malformed(f"a tensor whose storage is a {type(storage).__name__}")
    shape_ok = type(size) is tuple and type(stride) is tuple and len(size) == len(stride) <= MAX_TENSOR_DIMS
    if not (shape_ok and _is_index(storage_offset) and all(_is_index(n) for n in (*size, *stride))):
        raise _Malformed("a tensor with a malformed shape, stride or offset")
    numel = math.prod(size)
    extent = storage_offset + (
        1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) if numel else 0
    )
    available = storage.flat.numel()
    # numel too: more values than the storage holds is an expanded view of a few bytes (a stride of 0)
    if extent > available or numel > available:
        raise _Malformed(
            f"a tensor of shape {list(size)} at offset {storage_offset} reaching outside its storage of {available} "
            "values"
        )
    machine.budget.spend("tensor_bytes", numel * storage.flat.element_size())
    return storage.flat.as_strided(size, stride, storage_offset)


def _rebuild_parameter(
    machine: _PickleMachine, data: Any, requires_grad: Any, backward_hooks: Any, *state: Any
):
    if not isinstance(data, Tensor):
        raise _Malformed(f"a parameter of a {type(data).__name__}")
    return data  # a plain tensor: nothing here trains the pickle's own modules


# numpy dtype code -> struct format: the plain numbers a numpy scalar in an NVlabs pickle may be (their layers keep
# gains such as `weight_gain` as numpy float64 scalars). No structured, object, string or void dtypes.
_NUMPY_NUMBERS = {
    "b1": "?", "i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q", "u8": "Q",
    "f2": "e", "f4": "f", "f8": "d",
}  # fmt: skip


@dataclass
class _Dtype:
    """A numpy dtype as the reader's own record: a code from `_NUMPY_NUMBERS` and a byte order. It is never a
    numpy object, so nothing the file does to it (BUILD) reaches numpy."""

    code: str
    byte_order: str = "<"
    built: bool = False

    def set_state(self, state: Any) -> None:
        """BUILD on a dtype: numpy's state for a plain number is (3, byte order, None, None, None, -1, -1, 0);
        only the byte order is taken from it, and only once."""
        plain = (3, None, None, None, -1, -1, 0)
        if self.built or type(state) is not tuple or len(state) != 8:
            raise _Malformed("a numpy dtype state that is not a plain number's")
        if not all(type(a) is type(b) and a == b for a, b in zip((state[0], *state[2:]), plain, strict=True)):
            raise _Malformed("a numpy dtype state with fields, a sub-array or a size of its own")
        if type(state[1]) is not str or state[1] not in ("<", ">", "|"):
            raise _Malformed("a numpy dtype with an unknown byte order")
        self.byte_order, self.built = state[1], True


def _numpy_dtype(machine: _PickleMachine, code: Any, align: Any = False, copy: Any = True) -> _Dtype:
    if type(code) is not str or code not in _NUMPY_NUMBERS or align is not False or copy is not True:
        raise _Malformed(f"a numpy dtype other than a plain number ({_describe(code)})")
    return _Dtype(code)


def _numpy_scalar(machine: _PickleMachine, dtype: Any, data: Any = None) -> float | int | bool:
    if type(dtype) is not _Dtype:
        raise _Malformed(f"a numpy scalar of a {type(dtype).__name__}, not a plain number's dtype")
    fmt = (">" if dtype.byte_order == ">" else "<") + _NUMPY_NUMBERS[dtype.code]
    if type(data) is not bytes or len(data) != struct.calcsize(fmt):
        size = len(data) if type(data) is bytes else type(data).__name__
        raise _Malformed(f"a numpy {dtype.code} scalar from {size} bytes (it takes {struct.calcsize(fmt)})")
    return struct.unpack(fmt, data)[0]


@dataclass(frozen=True)
class _Builder:
    """What a global resolves to: one of the functions above, called by REDUCE (or NEWOBJ, for a class)."""

    name: str
    build: Callable[..., Any]
    is_class: bool = False


# --------------------------------------------------------------------------------------------------------------------
# The allow-lists: every global and opcode the reader accepts, with why an NVlabs pickle has it. Anything else stops
# the load in one paragraph naming it, before anything is built from it.

_GLOBALS: dict[tuple[str, str], tuple[_Builder, str]] = {
    ("torch_utils.persistence", "_reconstruct_persistent_obj"): (
        _Builder("persistent module", _reconstruct_persistent_obj),
        "every NVlabs network and layer; a record of its class name, source text and state, never executed",
    ),
    ("collections", "OrderedDict"): (
        _Builder("OrderedDict", _ordered_dict),
        "torch modules keep their parameters, buffers, children and hooks in OrderedDicts",
    ),
    ("builtins", "set"): (
        _Builder("set", _set),
        "protocol 3 (Python 3.7's default) writes a set, such as a module's non-persistent buffer names, so",
    ),
    ("dnnlib.util", "EasyDict"): (
        _Builder("EasyDict", _easy_dict, is_class=True),
        "NVlabs' networks' keyword arguments (mapping_kwargs, synthesis_kwargs, ...), read as the dicts they are",
    ),
    ("torch._utils", "_rebuild_tensor_v2"): (
        _Builder("tensor", _rebuild_tensor),
        "how torch pickles a tensor: a view (offset, shape, stride) of a storage",
    ),
    ("torch._utils", "_rebuild_parameter"): (
        _Builder("parameter", _rebuild_parameter),
        "how torch pickles an nn.Parameter: its tensor, read as a plain tensor",
    ),
    ("torch._utils", "_rebuild_parameter_with_state"): (
        _Builder("parameter", _rebuild_parameter),
        "the same, for a parameter with attributes of its own (which are dropped)",
    ),
    ("torch.storage", "_load_from_bytes"): (
        _Builder("storage", _load_storage),
        "how torch pickles a storage: its values as a small torch.save file, read here byte by byte",
    ),
    ("numpy", "dtype"): (
        _Builder("numpy dtype", _numpy_dtype),
        "the dtype of the numpy scalars below; only plain numbers, as the reader's own record",
    ),
    ("numpy.core.multiarray", "scalar"): (
        _Builder("numpy scalar", _numpy_scalar),
        "NVlabs' layers keep gains (weight_gain, ...) as numpy scalars; decoded here into Python numbers",
    ),
    ("numpy._core.multiarray", "scalar"): (
        _Builder("numpy scalar", _numpy_scalar),
        "the same, as numpy 2 names it",
    ),
}

# Inside a storage's bytes, the storage's type names its dtype (the only globals there; none is called).
_STORAGE_GLOBALS: dict[tuple[str, str], tuple[Any, str]] = {
    ("torch", f"{kind}Storage"): (dtype, "the storage types torch.save's legacy format names")
    for kind, dtype in {
        "Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16,
        "Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8,
        "Bool": torch.bool,
    }.items()
}  # fmt: skip

# opcode name -> (the _PickleMachine method that runs it, why an NVlabs pickle has it). Those left out: INST, OBJ
# and NEWOBJ_EX (build arbitrary classes), EXT1/2/4 (the copyreg registry), PERSID (a torch.save file's, not a
# pickle's), POP, DUP and the protocol 0/1 text opcodes (no protocol 2+ pickler writes them for this data),
# BINBYTES8, BINUNICODE8 and LONG4 (items over 4 GiB or integers over 255 bytes), BYTEARRAY8 and the out-of-band
# buffer opcodes (protocol 5's zero-copy buffers), FROZENSET, LIST, DICT.
_OPCODES: dict[str, tuple[str, str]] = {
    "PROTO": ("_proto", "the header of every pickle of protocol 2 and up"),
    "FRAME": (
        "_nothing",
        "protocol 4's framing, a read-ahead hint: the framed opcodes are read like any other",
    ),
    "STOP": ("_stop", "the end of the pickle"),
    "MARK": ("_mark", "opens the items of a tuple, a dict's or list's batch of items"),
    "NONE": ("_push_none", "None"),
    "NEWTRUE": ("_push_true", "True"),
    "NEWFALSE": ("_push_false", "False"),
    "BININT": ("_push_arg", "a 4-byte int"),
    "BININT1": ("_push_arg", "a 1-byte int"),
    "BININT2": ("_push_arg", "a 2-byte int"),
    "LONG1": ("_push_arg", "a larger int (up to 255 bytes)"),
    "BINFLOAT": ("_push_arg", "a float"),
    "SHORT_BINUNICODE": ("_push_arg", "a short string"),
    "BINUNICODE": ("_push_arg", "a string (a module's source text, names)"),
    "SHORT_BINBYTES": ("_push_arg", "short bytes (a numpy scalar's value)"),
    "BINBYTES": ("_push_arg", "bytes (a storage's values)"),
    "EMPTY_TUPLE": ("_push_empty_tuple", "()"),
    "EMPTY_LIST": ("_push_empty_list", "a list, filled by APPEND(S)"),
    "EMPTY_DICT": ("_push_empty_dict", "a dict, filled by SETITEM(S)"),
    "EMPTY_SET": ("_push_empty_set", "a set (torch modules keep their non-persistent buffers' names in one)"),
    "TUPLE": ("_tuple", "a tuple of the items since MARK"),
    "TUPLE1": ("_tuple1", "a tuple of one item"),
    "TUPLE2": ("_tuple2", "a tuple of two items"),
    "TUPLE3": ("_tuple3", "a tuple of three items"),
    "APPEND": ("_append", "an item added to a list"),
    "APPENDS": ("_appends", "items added to a list"),
    "SETITEM": ("_setitem", "a key and value added to a dict"),
    "SETITEMS": ("_setitems", "keys and values added to a dict"),
    "ADDITEMS": ("_additems", "items added to a set"),
    "MEMOIZE": ("_memoize", "an object kept to be referred to again (protocol 4)"),
    "BINPUT": ("_put", "the same, at a given index"),
    "LONG_BINPUT": ("_put", "the same, at a larger index"),
    "BINGET": ("_get", "an object kept earlier, referred to again"),
    "LONG_BINGET": ("_get", "the same, at a larger index"),
    "GLOBAL": ("_global", "a global by name (protocol 3): looked up in the allow-list only, never imported"),
    "STACK_GLOBAL": ("_stack_global", "the same, with the names on the stack (protocol 4)"),
    "REDUCE": ("_reduce", "a call of an allow-listed global's builder"),
    "NEWOBJ": ("_newobj", "an allow-listed class made empty (EasyDict)"),
    "BUILD": ("_build", "a numpy dtype's byte order, an EasyDict's empty state: nothing else is built"),
    "BINPERSID": ("_persistent_id", "a storage's record, inside a storage's bytes only"),
}


# --------------------------------------------------------------------------------------------------------------------
# The machine.


class _BoundedStream:
    """A file (or a storage's bytes) read only as far as it goes: a read of more bytes than remain, a length field
    pointing past the end, stops the load as a truncated file before anything is allocated for it."""

    def __init__(self, raw: Any, size: int):
        self.raw, self.size, self.remaining = raw, size, size

    def tell(self) -> int:  # where genops says a bad opcode is
        return self.size - self.remaining

    def read(self, n: int) -> bytes:
        if n > self.remaining:
            raise _Truncated(f"it ends early (truncated: {n} bytes asked for, {self.remaining} left)")
        data = self.raw.read(n)
        if len(data) != n:
            raise _Truncated("it ends early (truncated)")
        self.remaining -= n
        return data

    def readline(self) -> bytes:
        line = self.raw.readline(min(MAX_LINE, self.remaining))
        self.remaining -= len(line)
        return line


@dataclass
class _Budget:
    """What one file may still make the reader do, shared by its pickle and the pickles inside its storages. A
    pickle can refer back to what it built (the memo) as often as it likes for a few bytes each time, so work and
    bytes are counted where they are spent, not where the file spells them: storages' values and tensors' values
    each add up to at most the file's size, as they do in a file where each is written once."""

    opcodes: int
    storage_bytes: int
    tensor_bytes: int

    def spend(self, what: str, amount: int) -> None:
        left = getattr(self, what) - amount
        setattr(self, what, left)
        if left < 0:
            raise _Malformed(
                {
                    "opcodes": f"it takes more than {MAX_OPCODES:,} pickle opcodes and items to read",
                    "storage_bytes": "its storages add up to more bytes than the file holds (one storage read again)",
                    "tensor_bytes": "its tensors add up to more bytes than the file holds (views that overlap)",
                }[what]
            )


class _PickleMachine:
    """Runs a pickle's opcodes (decoded by `pickletools.genops`) on a stack of plain data; see `_OPCODES`. Globals
    resolve through `globals_table` only; BINPERSID goes to `persistent_load` where one is given."""

    def __init__(
        self,
        stream: _BoundedStream,
        globals_table: dict[tuple[str, str], tuple[Any, str]],
        budget: _Budget,
        persistent_load: Callable[[_StorageRecord], None] | None = None,
    ):
        self.stream, self.globals_table, self.budget = stream, globals_table, budget
        self.persistent_load = persistent_load
        self.handlers = {name: getattr(self, method) for name, (method, _) in _OPCODES.items()}
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.result: list[Any] = []

    def load(self) -> Any:
        for opcode, arg, _ in pickletools.genops(self.stream):
            self.budget.spend("opcodes", 1)
            handler = self.handlers.get(opcode.name)
            if handler is None:
                raise _Refused(f"it uses the pickle opcode {opcode.name}, which no NVlabs network pickle has")
            handler(arg)
        if len(self.result) != 1:
            raise _Truncated("it ends early (truncated)")
        return self.result[0]

    # -- the opcodes (see _OPCODES)

    def _proto(self, version: int) -> None:
        if not 2 <= version <= 5:
            raise _Malformed(f"pickle protocol {version}")

    def _nothing(self, arg: Any) -> None:
        pass

    def _stop(self, arg: Any) -> None:
        value = self.stack.pop()
        if self.stack or self.marks:
            raise _Malformed("it ends with data left over")
        self.result.append(value)

    def _mark(self, arg: Any) -> None:
        self.marks.append(len(self.stack))

    def _pop_mark(self) -> list[Any]:
        if not self.marks:
            raise _Malformed("a batch of items without its MARK")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def _push_arg(self, arg: Any) -> None:
        self.stack.append(arg)

    def _push_none(self, arg: Any) -> None:
        self.stack.append(None)

    def _push_true(self, arg: Any) -> None:
        self.stack.append(True)

    def _push_false(self, arg: Any) -> None:
        self.stack.append(False)

    def _push_empty_tuple(self, arg: Any) -> None:
        self.stack.append(())

    def _push_empty_list(self, arg: Any) -> None:
        self.stack.append([])

    def _push_empty_dict(self, arg: Any) -> None:
        self.stack.append({})

    def _push_empty_set(self, arg: Any) -> None:
        self.stack.append(set())

    def _tuple(self, arg: Any) -> None:
        self.stack.append(tuple(self._pop_mark()))

    def _tuple_of(self, count: int) -> None:
        if len(self.stack) - (self.marks[-1] if self.marks else 0) < count:
            raise _Malformed("a tuple of items that are not there")
        items = tuple(self.stack[-count:])
        del self.stack[-count:]
        self.stack.append(items)

    def _tuple1(self, arg: Any) -> None:
        self._tuple_of(1)

    def _tuple2(self, arg: Any) -> None:
        self._tuple_of(2)

    def _tuple3(self, arg: Any) -> None:
        self._tuple_of(3)

    def _target(self, kinds: tuple[type, ...]) -> Any:
        target = self.stack[-1]
        if type(target) not in kinds:
            raise _Malformed(f"items added to a {type(target).__name__}")
        return target

    @staticmethod
    def key(key: Any) -> Any:
        # Names and small numbers, as NVlabs' dicts and sets hold: their hashes cannot be made to collide (string
        # hashes are salted per process), so filling a dict stays linear in its size.
        if type(key) is str or (type(key) is int and -(2**31) <= key < 2**31):
            return key
        raise _Malformed(f"a dict key or set item of type {type(key).__name__}")

    def _append(self, arg: Any) -> None:
        value = self.stack.pop()
        self._target((list,)).append(value)

    def _appends(self, arg: Any) -> None:
        items = self._pop_mark()
        self._target((list,)).extend(items)

    def _setitem(self, arg: Any) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self._target((dict, OrderedDict, _EasyDict))[self.key(key)] = value

    def _setitems(self, arg: Any) -> None:
        items = self._pop_mark()
        if len(items) % 2:
            raise _Malformed("a dict's batch of items with a key and no value")
        target = self._target((dict, OrderedDict, _EasyDict))
        for index in range(0, len(items), 2):
            target[self.key(items[index])] = items[index + 1]

    def _additems(self, arg: Any) -> None:
        items = self._pop_mark()
        target = self._target((set,))
        for item in items:
            target.add(self.key(item))

    def _memoize(self, arg: Any) -> None:
        self.memo[len(self.memo)] = self.stack[-1]

    def _put(self, index: int) -> None:
        self.memo[index] = self.stack[-1]

    def _get(self, index: int) -> None:
        if index not in self.memo:
            raise _Malformed(f"it refers back to object {index}, which it never kept")
        self.stack.append(self.memo[index])

    def _resolve(self, module: Any, name: Any) -> None:
        if type(module) is not str or type(name) is not str:
            raise _Malformed("a global named by other than two strings")
        entry = self.globals_table.get((module, name))
        if entry is None:
            raise RefusedGlobal(module[:100], name[:100])
        self.stack.append(entry[0])

    def _global(self, names: str) -> None:
        module, _, name = names.partition(" ")
        self._resolve(module, name)

    def _stack_global(self, arg: Any) -> None:
        name = self.stack.pop()
        self._resolve(self.stack.pop(), name)

    def _reduce(self, arg: Any) -> None:
        args = self.stack.pop()
        builder = self.stack[-1]
        if type(builder) is not _Builder or type(args) is not tuple:
            raise _Refused(
                f"it calls a {type(builder).__name__} (REDUCE), which no NVlabs network pickle does"
            )
        self.stack[-1] = builder.build(self, *args)

    def _newobj(self, arg: Any) -> None:
        args = self.stack.pop()
        builder = self.stack.pop()
        if type(builder) is not _Builder or not builder.is_class or type(args) is not tuple:
            raise _Refused(
                f"it makes a {_describe(builder)} object (NEWOBJ), which no NVlabs network pickle does"
            )
        self.stack.append(builder.build(self, *args))

    def _build(self, arg: Any) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        if type(target) is _Dtype:
            target.set_state(state)
        elif type(target) is _EasyDict and (state is None or (type(state) is dict and not state)):
            pass  # a dict subclass's (empty) attribute dict, which older Pythons pickle as its state
        else:
            raise _Refused(
                f"it sets the state of a {type(target).__name__} (BUILD, which calls __setstate__), which no NVlabs "
                "network pickle does"
            )

    def _persistent_id(self, arg: Any) -> None:
        pid = self.stack.pop()
        if self.persistent_load is None:
            raise _Refused("it holds a persistent id: a torch.save file, not a pickle")
        record = _storage_record(pid)
        self.persistent_load(record)
        self.stack.append(record)


def _describe(value: Any) -> str:
    """A value named in a message: short, and never the repr of something nested (which can recurse too deep)."""
    if isinstance(value, _Builder):
        return value.name
    if value is None or type(value) in (bool, int, float, str):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"a {type(value).__name__}"


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(str(text).split())[:limit]


def _refusal(key: str, path: Path, what: str) -> str:
    return (
        f"{key}={path} does not load as data only: {what}. An NVlabs network pickle holds only tensors, plain "
        "containers and NVlabs' persistent modules, which Pixelsmith reads as data; Pixelsmith never runs code "
        "from a pickle, so anything else is refused unrun. Give a network pickle written by NVlabs' "
        f"stylegan2-ada-pytorch ({NVLABS_REPO}) training, or a Pixelsmith checkpoint (a .ckpt)."
    )


def _malformed(key: str, path: Path, what: str) -> str:
    return (
        f"{key}={path} is damaged or is not an NVlabs network pickle: {what}. Pixelsmith reads an NVlabs pickle "
        "as data, checking every length, offset, count and type it declares, within fixed bounds, and refuses one "
        "that does not add up rather than guess. Download it again (a copy cut short or altered), or give a network "
        f"pickle written by NVlabs' stylegan2-ada-pytorch ({NVLABS_REPO}) training, or a Pixelsmith checkpoint "
        "(a .ckpt)."
    )


def _as_refusal(key: str, path: Path, err: BaseException) -> NVlabsPickleError:
    """Any failure of reading or converting the file as its one paragraph."""
    if isinstance(err, _Refused):
        return NVlabsPickleError(_refusal(key, path, _one_line(err)))
    if isinstance(err, _Malformed):
        return NVlabsPickleError(_malformed(key, path, _one_line(err)))
    if isinstance(err, EOFError):
        return NVlabsPickleError(_malformed(key, path, "it ends early (truncated)"))
    return NVlabsPickleError(_malformed(key, path, f"{type(err).__name__}: {_one_line(err)}"))


def read_pickle(path: str | Path, key: str = "source") -> dict[str, Any]:
    """The pickle's top-level dict with its networks as PersistentObjects, or one paragraph saying why not."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise NVlabsPickleError(
            f"{key}={path} does not exist. Give an NVlabs network pickle (e.g. ffhq.pkl, downloaded from the "
            f"links in {NVLABS_REPO}#readme) or a Pixelsmith checkpoint."
        )
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if handle.read(4) == b"PK\x03\x04":
                raise _Refused("it is a torch.save file (a zip archive), not a pickle")
            handle.seek(0)
            budget = _Budget(opcodes=MAX_OPCODES, storage_bytes=size, tensor_bytes=size)
            data = _PickleMachine(_BoundedStream(handle, size), _GLOBALS, budget).load()
        if type(data) is dict and all(type(data.get(k)) is PersistentObject for k in NETWORK_KEYS):
            for network in (*(data[k] for k in NETWORK_KEYS), data.get("augment_pipe")):
                if type(network) is PersistentObject:
                    network.tensors()  # every module tree walked once, within its bounds, before any use
    except PixelsmithError:
        raise
    except Exception as err:
        # whatever a hostile file makes fail (RecursionError, MemoryError, ...): one paragraph, never a traceback
        raise _as_refusal(key, path, err) from None
    if type(data) is not dict or not all(type(data.get(k)) is PersistentObject for k in NETWORK_KEYS):
        found = sorted(str(k)[:40] for k in data)[:12] if type(data) is dict else type(data).__name__
        raise NVlabsPickleError(
            f"{key}={path} is a pickle, but not an NVlabs network snapshot: it holds {found}, not the networks "
            f"{', '.join(NETWORK_KEYS)} that stylegan2-ada-pytorch's training writes (network-snapshot-*.pkl). "
            "Give such a snapshot, or one of NVlabs' published network pickles."
        )
    return data


# --------------------------------------------------------------------------------------------------------------------
# The architecture check and the mapping onto Pixelsmith's StyleGAN2.


@dataclass
class Converted:
    """Pixelsmith state dicts of G, D and G_ema, the settings that build them, and what was mapped (for the log)."""

    generator: dict[str, Any]
    discriminator: dict[str, Any]
    state_dicts: dict[str, dict[str, Tensor]]
    report: list[str] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)

    def overrides(self) -> list[str]:
        """The command-line keys that build these networks (`model.generator.z_dim=512` ...)."""
        items = [("generator", k, v) for k, v in self.generator.items()]
        items += [("discriminator", k, v) for k, v in self.discriminator.items()]
        return [f"model.{role}.{k}={'null' if v is None else v}" for role, k, v in items]


def _differs(path: Path, what: str) -> NVlabsPickleError:
    return NVlabsPickleError(
        f"{path} holds a network Pixelsmith's StyleGAN2 does not have: {what}. Pixelsmith converts "
        f"stylegan2-ada-pytorch's StyleGAN2 networks ({NVLABS_REPO}: training/networks.py, any --cfg) and "
        "stylegan3's --cfg=stylegan2 ones; train this network with NVlabs' own code instead."
    )


# The settings taken from a pickle's init kwargs, each cast to its type and checked against a range far beyond
# NVlabs' networks (512 wide, 1024 px) before anything is built from it: name -> (type, smallest, largest).
_SETTINGS: dict[str, tuple[type, float, float]] = {
    "img_resolution": (int, 4, 8192),
    "img_channels": (int, 1, 64),
    "z_dim": (int, 0, 16384),
    "w_dim": (int, 1, 16384),
    "c_dim": (int, 0, 1_000_000),
    "num_layers": (int, 1, 64),
    "lr_multiplier": (float, 1e-9, 1e3),
    "layer_features": (int, 1, 16384),
    "embed_features": (int, 1, 16384),
    "channel_base": (int, 1, 2**24),
    "channel_max": (int, 1, 16384),
    "num_fp16_res": (int, 0, 16),
    "conv_clamp": (float, 1e-9, 1e9),
    "use_noise": (bool, 0, 1),
    "mbstd_group_size": (int, 1, 1024),
    "mbstd_num_channels": (int, 0, 1024),
}


def _bad_setting(path: Path, where: str, value: Any, expected: str) -> NVlabsPickleError:
    return NVlabsPickleError(
        f"{path} declares {where}={_describe(value)}, which no StyleGAN2 network Pixelsmith converts has "
        f"({expected}). The file is damaged or was not written by NVlabs' training: give a network pickle written "
        f"by stylegan2-ada-pytorch ({NVLABS_REPO}), or a Pixelsmith checkpoint."
    )


def _setting(path: Path, kwargs: dict[str, Any], name: str, default: Any, where: str = "") -> Any:
    """kwargs[name] (or `default` where it is absent), as the type `_SETTINGS` gives, within its range. None stays
    None where the default is None (an optional setting)."""
    value = kwargs.get(name, default)
    if value is None and default is None:
        return None
    kind, low, high = _SETTINGS[name]
    if kind is float and type(value) in (int, float) and math.isfinite(value):
        value = float(value)
    if type(value) is not kind or not low <= value <= high:
        raise _bad_setting(path, f"{where}{name}", value, f"{kind.__name__} from {low:g} to {high:g}")
    return value


def _kwargs(path: Path, kwargs: dict[str, Any], name: str) -> dict[str, Any]:
    value = kwargs.get(name)
    if value is None:
        return {}
    if type(value) not in (dict, OrderedDict, _EasyDict):
        raise _bad_setting(path, name, value, "a dict of keyword arguments")
    return dict(value)


def _check_generator(path: Path, G: PersistentObject) -> dict[str, Any]:
    synthesis = G.children.get("synthesis")
    if synthesis is None or "b4" not in synthesis.children:
        layers = [name[:40] for name in sorted(synthesis.children)[:4]] if synthesis else []
        if "input" in layers or "class SynthesisInput" in (synthesis.module_src if synthesis else ""):
            kwargs = _kwargs(path, G.init_kwargs, "synthesis_kwargs")
            radial = kwargs.get("use_radial_filters") is True or _describe(kwargs.get("conv_kernel")) == "1"
            raise _differs(
                path,
                f"StyleGAN3 (stylegan3{'-r' if radial else '-t'}: a Fourier-feature input and alias-free filtered "
                f"layers {', '.join(layers)}..., where StyleGAN2 starts from a learned 4x4 constant, b4.const)",
            )
        raise _differs(path, f"a generator without StyleGAN2's synthesis blocks (class {G.class_name})")
    kwargs = G.init_kwargs
    mapping = _kwargs(path, kwargs, "mapping_kwargs")
    synthesis_kwargs = _kwargs(path, kwargs, "synthesis_kwargs")
    w_dim = _setting(path, kwargs, "w_dim", None)
    resolution = _setting(path, kwargs, "img_resolution", None)
    if resolution & (resolution - 1):
        raise _bad_setting(path, "img_resolution", resolution, "a power of two")
    architecture = synthesis_kwargs.get("architecture", "skip")
    if type(architecture) is not str or architecture != "skip":
        raise _differs(
            path, f"the synthesis architecture is {_describe(architecture)} (Pixelsmith's is 'skip')"
        )
    for name, what in (
        ("layer_features", "the mapping layers' width"),
        ("embed_features", "the label embedding's"),
    ):
        features = _setting(path, mapping, name, None, "mapping_kwargs.")
        if features not in (None, w_dim):
            raise _differs(path, f"{what} is {features} (Pixelsmith's are w_dim={w_dim} wide)")
    resample_filter = synthesis_kwargs.get("resample_filter", [1, 3, 3, 1])
    if type(resample_filter) not in (list, tuple) or list(resample_filter[:5]) != [1, 3, 3, 1]:
        raise _differs(
            path, f"the resampling filter is {_describe(resample_filter)} (Pixelsmith's is [1, 3, 3, 1])"
        )
    z_dim = _setting(path, kwargs, "z_dim", None)
    if z_dim == 0:
        raise _differs(path, "z_dim is 0")
    return {
        "resolution": resolution,
        "channels": _setting(path, kwargs, "img_channels", None),
        "z_dim": z_dim,
        "w_dim": w_dim,
        "c_dim": _setting(path, kwargs, "c_dim", 0),
        "mapping_layers": _setting(path, mapping, "num_layers", 8, "mapping_kwargs."),
        "mapping_lr_multiplier": _setting(path, mapping, "lr_multiplier", 0.01, "mapping_kwargs."),
        "channel_base": _setting(path, synthesis_kwargs, "channel_base", 32768, "synthesis_kwargs."),
        "channel_max": _setting(path, synthesis_kwargs, "channel_max", 512, "synthesis_kwargs."),
        "use_noise": _setting(path, synthesis_kwargs, "use_noise", True, "synthesis_kwargs."),
        "upsampling": "fir",
        "num_fp16_res": _setting(path, synthesis_kwargs, "num_fp16_res", 0, "synthesis_kwargs."),
        "conv_clamp": _setting(path, synthesis_kwargs, "conv_clamp", None, "synthesis_kwargs."),
    }


def _check_discriminator(path: Path, D: PersistentObject) -> dict[str, Any]:
    kwargs = D.init_kwargs
    if "b4" not in D.children:
        raise _differs(path, f"a discriminator without StyleGAN2's blocks (class {D.class_name})")
    epilogue = _kwargs(path, kwargs, "epilogue_kwargs")
    c_dim = _setting(path, kwargs, "c_dim", 0)
    if c_dim:
        raise _differs(
            path,
            f"a class-conditional discriminator (c_dim={c_dim}: a label mapping network projected onto D's output, "
            "cmap), which Pixelsmith's StyleGAN2 discriminator has no counterpart for",
        )
    mbstd_channels = _setting(path, epilogue, "mbstd_num_channels", 1, "epilogue_kwargs.")
    if mbstd_channels != 1:
        raise _differs(path, f"mbstd_num_channels={mbstd_channels} (Pixelsmith's is 1)")
    architecture = kwargs.get("architecture", "resnet")
    if type(architecture) is not str or architecture not in ("resnet", "orig", "skip"):
        raise _differs(path, f"the discriminator architecture {_describe(architecture)}")
    resolution = _setting(path, kwargs, "img_resolution", None)
    if resolution & (resolution - 1):
        raise _bad_setting(path, "img_resolution", resolution, "a power of two")
    group_size = _setting(path, epilogue, "mbstd_group_size", None, "epilogue_kwargs.")
    return {
        "resolution": resolution,
        "channels": _setting(path, kwargs, "img_channels", None),
        "channel_base": _setting(path, kwargs, "channel_base", 32768),
        "channel_max": _setting(path, kwargs, "channel_max", 512),
        "mbstd_group_size": 4 if group_size is None else group_size,
        "architecture": architecture,
        "downsampling": "fir",
        "num_fp16_res": _setting(path, kwargs, "num_fp16_res", 0),
        "conv_clamp": _setting(path, kwargs, "conv_clamp", None),
    }


def _generator_name(name: str, block_index: dict[str, int]) -> str | None:
    """NVlabs' G tensor name -> ours; None for the constant resampling filters."""
    parts = name.split(".")
    if parts[-1] == "resample_filter":
        return None
    if parts[0] == "mapping":
        if parts[1].startswith("fc"):
            return f"mapping.layers.{int(parts[1][2:])}.{parts[2]}"
        return name  # mapping.embed.*, mapping.w_avg
    block = f"synthesis.blocks.{block_index[parts[1]]}"
    layer, rest = parts[2], parts[3:]
    if layer == "const":
        return f"{block}.const"
    if layer == "torgb":
        return f"{block}.to_image.bias" if rest == ["bias"] else f"{block}.to_image.conv.{'.'.join(rest)}"
    if rest[0] in ("affine", "weight"):
        return f"{block}.{layer}.conv.{'.'.join(rest)}"
    return f"{block}.{layer}.{'.'.join(rest)}"  # noise_strength, noise_const, bias


def _discriminator_name(name: str, block_index: dict[str, int], top: str) -> str | None:
    parts = name.split(".")
    if parts[-1] == "resample_filter":
        return None
    block, layer, rest = parts[0], parts[1], ".".join(parts[2:])
    if block == "b4":
        epilogue = {
            "fromrgb": "epilogue_from_image",
            "conv": "epilogue_conv",
            "fc": "epilogue_fc",
            "out": "out",
        }
        return f"{epilogue[layer]}.{rest}"
    if layer == "fromrgb":
        return f"from_image.{rest}" if block == top else f"blocks.{block_index[block]}.from_image.{rest}"
    return f"blocks.{block_index[block]}.{layer}.{rest}"


def _rename(tensors: dict[str, Tensor], rename) -> dict[str, Tensor]:
    """NVlabs' names -> Pixelsmith's, as views (nothing copied yet); their scalar noise strengths as [1]."""
    out = {}
    for name, tensor in tensors.items():
        ours = rename(name)
        if ours is not None:
            out[ours] = tensor.reshape(1) if ours.endswith("noise_strength") else tensor
    return out


def _mismatches(own: dict[str, Tensor], state: dict[str, Tensor]) -> list[str]:
    """How `state` differs from a network's own state dict (NVlabs' noise_const buffers are optional)."""
    problems = [
        f"{k}: missing in the pickle" for k in own if k not in state and not k.endswith("noise_const")
    ]
    problems += [f"{k}: not in this network" for k in state if k not in own and not k.endswith("noise_const")]
    problems += [
        f"{k}: {tuple(state[k].shape)} in the pickle, {tuple(v.shape)} here"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    return problems


def _check_shapes(
    path: Path, settings: dict[str, dict[str, Any]], named: dict[str, dict[str, Tensor]]
) -> None:
    """The networks the settings build, laid out on the meta device (no memory, whatever the settings say),
    against the pickle's tensors: a pickle whose settings do not match its own tensors is refused here, before a
    network of its settings' size is allocated for real."""
    from pixelsmith.gan.networks.stylegan2 import StyleGAN2Discriminator, StyleGAN2Generator

    classes = {"G": StyleGAN2Generator, "G_ema": StyleGAN2Generator, "D": StyleGAN2Discriminator}
    roles = {"G": "generator", "G_ema": "generator", "D": "discriminator"}
    for name, tensors in named.items():
        try:
            with torch.device("meta"):
                network = classes[name](**settings[roles[name]])
        except ValueError as err:
            raise _differs(path, f"settings Pixelsmith's {roles[name]} refuses ({_one_line(err)})") from None
        problems = _mismatches(network.state_dict(), tensors)
        if problems:
            raise _differs(
                path, f"{name}'s tensors do not match its own settings ({'; '.join(problems[:4])})"
            )


def _as_float32(tensors: dict[str, Tensor], done: dict[int, Tensor]) -> dict[str, Tensor]:
    """Each tensor as a contiguous float32 copy, made once per tensor however many names it has."""
    out = {}
    for name, tensor in tensors.items():
        if id(tensor) not in done:
            done[id(tensor)] = tensor.detach().to(torch.float32).contiguous()
        out[name] = done[id(tensor)]
    return out


def convert_pickle(path: str | Path, key: str = "source") -> Converted:
    """G, D and G_ema of an NVlabs pickle as Pixelsmith state dicts and settings (see the module docstring)."""
    path = Path(path).expanduser()
    data = read_pickle(path, key)
    try:
        return _convert(path, data)
    except PixelsmithError:
        raise
    except Exception as err:
        # whatever a hostile file makes fail: one paragraph, never a traceback
        raise _as_refusal(key, path, err) from None


def _convert(path: Path, data: dict[str, Any]) -> Converted:
    G, D, G_ema = (data[k] for k in NETWORK_KEYS)
    generator = _check_generator(path, G)
    if _check_generator(path, G_ema) != generator:
        raise _differs(path, "a G_ema whose settings differ from G's")
    discriminator = _check_discriminator(path, D)
    resolution = generator["resolution"]
    levels = range(2, int(math.log2(resolution)) + 1)
    g_blocks = {f"b{2**level}": index for index, level in enumerate(levels)}
    d_blocks = {f"b{2**level}": index for index, level in enumerate(reversed(list(levels)[1:]))}
    top = f"b{resolution}"
    try:
        named = {
            "G": _rename(G.tensors(), lambda n: _generator_name(n, g_blocks)),
            "G_ema": _rename(G_ema.tensors(), lambda n: _generator_name(n, g_blocks)),
            "D": _rename(D.tensors(), lambda n: _discriminator_name(n, d_blocks, top)),
        }
    except (KeyError, IndexError, ValueError, RuntimeError) as err:
        raise _differs(path, f"a tensor named where StyleGAN2 has none ({_one_line(err, 100)})") from None
    _check_shapes(path, {"generator": generator, "discriminator": discriminator}, named)
    done: dict[int, Tensor] = {}
    state_dicts = {name: _as_float32(tensors, done) for name, tensors in named.items()}
    report = [
        f"{k}: {len(v)} tensors, {sum(t.numel() for t in v.values()):,} values"
        for k, v in state_dicts.items()
    ]
    settings = data.get("training_set_kwargs")
    plain = (str, int, float, bool, type(None))
    extras: dict[str, Any] = {
        "training_set_kwargs": {
            k: v
            for k, v in (settings.items() if type(settings) in (dict, _EasyDict) else ())
            if type(v) in plain
        }
    }
    augment = data.get("augment_pipe")
    if type(augment) is PersistentObject:
        p = augment.tensors().get("p")
        extras["augment_p"] = float(p.reshape(-1)[0]) if p is not None and p.numel() else None
        if extras["augment_p"] is not None and not 0.0 <= extras["augment_p"] <= 1.0:
            raise _bad_setting(path, "augment_pipe.p", extras["augment_p"], "a probability, from 0 to 1")
    return Converted(generator, discriminator, state_dicts, report, extras)


def load_into(converted: Converted, networks: dict[str, torch.nn.Module], source: Path) -> None:
    """Load the converted tensors into built networks ("G", "D", "G_ema"), strictly: a network that does not fit
    is refused with the settings that build one that does."""
    for name, network in networks.items():
        result = _load_strict(network, converted.state_dicts[name])
        if result:
            raise PixelsmithError(
                f"{source}'s {name} does not fit the {name} this config builds ({'; '.join(result[:4])}). Build "
                f"the network the pickle holds: {' '.join(converted.overrides())} (convert.py writes a checkpoint "
                "with these settings)."
            )


def _load_strict(network: torch.nn.Module, state: dict[str, Tensor]) -> list[str]:
    problems = _mismatches(network.state_dict(), state)
    if not problems:
        network.load_state_dict(state, strict=True)
    return problems
