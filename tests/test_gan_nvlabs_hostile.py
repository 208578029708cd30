"""Hostile NVlabs network pickles: the reader (pixelsmith.gan.nvlabs) is memory-safe, bounded, and runs nothing.

Each finding of a security review is reproduced with a crafted file, and each file is refused in one paragraph
(NVlabsPickleError; exit 2 from convert.py and generate.py), quickly, with nothing it asks for run:
- a numpy dtype given fields past its item size by BUILD (dtype.__setstate__), then read by numpy's `scalar`: with
  the reader's old allow-list (numpy's own dtype and scalar) this returned heap memory, or ended in SIGSEGV;
- modules that share children 60 levels deep (2^60 paths for a recursive walk), a module that is its own child;
- `_rebuild_tensor_v2` with a storage offset far past its storage (torch's `set_` grows the storage to fit);
- a dict given as a storage; storages whose declared count is not their payload; views adding up past the file.
The crafted files run in a child process, so a crash or a hang is seen as one and names the file. Globals from
several modules (torch's among them) are refused wherever they sit, each asserting that nothing ran. A seeded
property test runs hundreds of mutated and cut copies of the committed fixtures through the reader, also in a child.
The crafted files are written opcode by opcode (`_Pickle`), as no pickler would write them.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import random
import struct
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from pixelsmith.gan.nvlabs import MAX_MODULE_DEPTH, NVlabsPickleError, convert_pickle, read_pickle
from tests.conftest import CHECKOUT, run_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvlabs"
FIXTURE_PICKLES = sorted(FIXTURES.glob("*.pkl"))
RESNET = FIXTURES / "sg2ada_resnet_32px.pkl"


def _one_paragraph(message: str) -> None:
    assert message.strip() and "\n" not in message.strip() and "Traceback" not in message, message


# ---- a pickle written opcode by opcode (protocol 3) -----------------------------------------------------------------


class _Pickle:
    """Byte strings of pickle opcodes, composed: `call(glob("os", "system"), text("..."))` is `os.system("...")`."""

    NONE, TRUE, FALSE = b"N", b"\x88", b"\x89"

    @staticmethod
    def glob(module: str, name: str) -> bytes:
        return b"c" + f"{module}\n{name}\n".encode()

    @staticmethod
    def text(value: str) -> bytes:
        raw = value.encode()
        return b"X" + struct.pack("<I", len(raw)) + raw

    @staticmethod
    def raw(value: bytes) -> bytes:
        return b"B" + struct.pack("<I", len(value)) + value

    @staticmethod
    def int(value: int) -> bytes:
        if -(2**31) <= value < 2**31:
            return b"J" + struct.pack("<i", value)
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        return b"\x8a" + bytes([len(raw)]) + raw

    @staticmethod
    def float(value: float) -> bytes:
        return b"G" + struct.pack(">d", value)

    @staticmethod
    def tuple(*items: bytes) -> bytes:
        return b"(" + b"".join(items) + b"t"

    @classmethod
    def call(cls, func: bytes, *args: bytes) -> bytes:
        return func + cls.tuple(*args) + b"R"

    @staticmethod
    def dict(*pairs: tuple[bytes, bytes]) -> bytes:
        return b"}(" + b"".join(key + value for key, value in pairs) + b"u"

    @staticmethod
    def put(index: int) -> bytes:
        return b"r" + struct.pack("<I", index)

    @staticmethod
    def get(index: int) -> bytes:
        return b"j" + struct.pack("<I", index)

    @staticmethod
    def file(body: bytes) -> bytes:
        return b"\x80\x03" + body + b"."


P = _Pickle


def _storage_payload(values: list[float]) -> bytes:
    """The bytes torch pickles a float32 storage of `values` as (torch.storage._load_from_bytes's argument)."""
    ops = pickletools.genops(pickle.dumps(torch.tensor(values, dtype=torch.float32)))
    return next(arg for op, arg, _ in ops if op.name in ("BINBYTES", "SHORT_BINBYTES"))


def _storage(values: list[float] | None = None, payload: bytes | None = None) -> bytes:
    return P.call(
        P.glob("torch.storage", "_load_from_bytes"), P.raw(payload or _storage_payload(values or [1.0]))
    )


def _tensor(storage: bytes, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> bytes:
    return P.call(
        P.glob("torch._utils", "_rebuild_tensor_v2"),
        storage,
        P.int(offset),
        P.tuple(*map(P.int, size)),
        P.tuple(*map(P.int, stride)),
        P.FALSE,
        P.call(P.glob("collections", "OrderedDict")),
    )


def _module(class_name: str, params=(), modules=(), kwargs=()) -> bytes:
    """An NVlabs persistent module: `_reconstruct_persistent_obj({class_name, module_src, state})`."""
    state = P.dict(
        (P.text("_parameters"), P.dict(*((P.text(k), v) for k, v in params))),
        (P.text("_buffers"), P.dict()),
        (P.text("_modules"), P.dict(*((P.text(k), v) for k, v in modules))),
        (P.text("_init_kwargs"), P.dict(*((P.text(k), v) for k, v in kwargs))),
    )
    meta = P.dict(
        (P.text("class_name"), P.text(class_name)),
        (P.text("module_src"), P.text("")),
        (P.text("state"), state),
    )
    return P.call(P.glob("torch_utils.persistence", "_reconstruct_persistent_obj"), meta)


def _snapshot(network: bytes, index: int = 999_999) -> bytes:
    """{'G', 'D', 'G_ema'}, all three the same `network` (kept under memo `index`)."""
    net = network + P.put(index)
    return P.file(P.dict((P.text("G"), net), (P.text("D"), P.get(index)), (P.text("G_ema"), P.get(index))))


def _one_tensor_network(tensor: bytes) -> bytes:
    return _snapshot(_module("Generator", params=[("w", tensor)]))


def _dtype(code: str, state: bytes | None = None) -> bytes:
    """numpy.dtype(code, False, True), then BUILD with `state` where one is given (as numpy pickles a dtype)."""
    made = P.call(P.glob("numpy", "dtype"), P.text(code), P.FALSE, P.TRUE)
    return made + (state + b"b" if state is not None else b"")


def _fields_state(offset: int, itemsize: int = 8) -> bytes:
    """numpy's dtype state for one 8-byte field 'a' at `offset`: a structured dtype numpy would build from it."""
    field = P.tuple(_dtype("u8"), P.int(offset))
    return P.tuple(
        P.int(3), P.text("|"), P.NONE, P.tuple(P.text("a")), P.dict((P.text("a"), field)),
        P.int(itemsize), P.int(1), P.int(16),
    )  # fmt: skip


# numpy's state of a plain little-endian number's dtype, as np.dtype("f8").__reduce__() gives it
PLAIN_STATE = P.tuple(P.int(3), P.text("<"), P.NONE, P.NONE, P.NONE, P.int(-1), P.int(-1), P.int(0))


def _scalar(dtype: bytes, data: bytes) -> bytes:
    return P.call(P.glob("numpy.core.multiarray", "scalar"), dtype, P.raw(data))


def _in_kwargs(value: bytes) -> bytes:
    return _snapshot(_module("Generator", kwargs=[("weight_gain", value)]))


def _dag(levels: int) -> bytes:
    """Modules whose two children are one and the same module, `levels` deep: 2^levels paths, `levels` modules."""
    body = _module("Leaf", params=[("w", _tensor(_storage([1.0]), 0, (1,), (1,)))]) + P.put(0)
    for level in range(1, levels):
        body = _module(f"L{level}", modules=[("a", body), ("b", P.get(level - 1))]) + P.put(level)
    return _snapshot(body)


def _own_child(through: int = 1) -> bytes:
    """A module that is its own descendant, `through` modules round. Each module's `_modules` dict is kept in the
    memo and given its child after the modules are built, as pickles of cyclic objects are written."""
    modules = links = b""
    for index in range(through):
        parameters = P.dict((P.text("w"), _tensor(_storage([1.0]), 0, (1,), (1,))))
        state = P.dict(
            (P.text("_parameters"), parameters), (P.text("_modules"), P.dict() + P.put(100 + index))
        )
        meta = P.dict((P.text("class_name"), P.text(f"M{index}")), (P.text("state"), state))
        built = P.call(P.glob("torch_utils.persistence", "_reconstruct_persistent_obj"), meta) + P.put(
            200 + index
        )
        modules += P.text(f"m{index}") + built
        child = P.get(200 + (index + 1) % through)
        links += P.text(f"link{index}") + P.get(100 + index) + b"(" + P.text("child") + child + b"u"
    networks = b"".join(P.text(key) + P.get(200) for key in ("G", "D", "G_ema"))
    return P.file(b"}(" + modules + links + networks + b"u")


def _views(count: int, size: int) -> bytes:
    """`count` views of one `size`-value storage: each in bounds, together far more bytes than the file holds."""
    storage = _storage([0.5] * size) + P.put(0)
    tensors = [(f"w{i}", _tensor(storage if i == 0 else P.get(0), 0, (size,), (1,))) for i in range(count)]
    return _snapshot(_module("Generator", params=tensors))


def _shared_state(count: int) -> bytes:
    """`count` modules built from one state (referred back to), whose `_modules` lists all of them: each module
    has `count` children, count^2 child entries in all, from a file of a few bytes per module."""
    recon = P.glob("torch_utils.persistence", "_reconstruct_persistent_obj")
    state = P.dict((P.text("_modules"), P.dict() + P.put(0))) + P.put(1)
    meta = P.dict((P.text("class_name"), P.text("M")), (P.text("state"), state)) + P.put(2)
    modules = b"".join(
        P.text(f"m{i}") + P.call(recon, meta if i == 0 else P.get(2)) + P.put(10 + i) for i in range(count)
    )
    links = (
        P.text("links")
        + P.get(0)
        + b"("
        + b"".join(P.text(f"c{i}") + P.get(10 + i) for i in range(count))
        + b"u"
    )
    networks = b"".join(P.text(key) + P.get(10) for key in ("G", "D", "G_ema"))
    return P.file(b"}(" + modules + links + networks + b"u")


def _sets_of_one_list(items: int, sets: int) -> bytes:
    """builtins.set (protocol 3's sets) of one `items`-long list, `sets` times: a few bytes per set."""
    listed = b"]" + P.put(0) + b"(" + b"K\x01" * items + b"e"
    made = [P.call(P.glob("builtins", "set"), listed if i == 0 else P.get(0)) for i in range(sets)]
    return _in_kwargs(P.tuple(*made))


def _storage_read_again(times: int) -> bytes:
    """One storage's bytes (64 KiB) kept in the memo and read as a storage `times` times, a few bytes each."""
    load = P.glob("torch.storage", "_load_from_bytes")
    payload = P.raw(_storage_payload([0.5] * 16384)) + P.put(0)
    tensors = [
        (f"w{i}", _tensor(P.call(load, payload if i == 0 else P.get(0)), 0, (1,), (1,))) for i in range(times)
    ]
    return _snapshot(_module("G", params=tensors))


def _payload_with_count(count: int) -> bytes:
    """A storage's bytes whose data header declares `count` values (it holds 4)."""
    payload = _storage_payload([1.0, 2.0, 3.0, 4.0])
    at = len(payload) - 4 * 4 - 8
    assert int.from_bytes(payload[at : at + 8], "little") == 4
    return payload[:at] + struct.pack("<q", count) + payload[at + 8 :]


def _deep_list(depth: int) -> bytes:
    return b"]" * depth + b"a" * (depth - 1)


# name -> (file bytes, what the refusal says)
HOSTILE: dict[str, tuple[bytes, str]] = {
    # The review's out-of-bounds read: fields past the item size, given by the dtype's own code or by BUILD.
    "dtype_field_offset_64KiB": (
        P.file(_scalar(_dtype("V8", _fields_state(65536)), b"\0" * 8)),
        "numpy dtype",
    ),
    "dtype_field_offset_100GB": (
        P.file(_scalar(_dtype("V8", _fields_state(10**11)), b"\0" * 8)),
        "numpy dtype",
    ),
    "dtype_f8_given_fields_by_build": (
        P.file(_scalar(_dtype("f8", _fields_state(65536)), b"\0" * 8)),
        "numpy dtype state with fields",
    ),
    "dtype_built_twice": (
        P.file(_scalar(_dtype("f8", PLAIN_STATE) + PLAIN_STATE + b"b", b"\0" * 8)),
        "numpy dtype state that is not a plain number's",
    ),  # fmt: skip
    "dtype_object": (P.file(_scalar(_dtype("O"), b"\0" * 8)), "numpy dtype other than a plain number"),
    "dtype_subarray": (
        P.file(P.call(P.glob("numpy", "dtype"), P.tuple(P.text("f8"), P.tuple(P.int(10**6))))),
        "numpy dtype other than a plain number",
    ),  # fmt: skip
    "scalar_from_1_byte": (P.file(_scalar(_dtype("f8"), b"\0")), "scalar from 1 bytes (it takes 8)"),
    "scalar_from_64KiB": (P.file(_scalar(_dtype("f8"), b"\0" * 65536)), "scalar from 65536 bytes"),
    "scalar_of_a_string_dtype": (P.file(_scalar(P.text("f8"), b"\0" * 8)), "numpy scalar of a str"),
    # Module walks: 2^60 paths; cycles of one and of three modules.
    "dag_60_levels": (_dag(60), f"nest more than {MAX_MODULE_DEPTH} deep"),
    "dag_12_levels": (_dag(12), "without StyleGAN2's synthesis blocks"),  # walked once each: 12 modules
    "own_child": (_own_child(1), "without StyleGAN2's synthesis blocks"),
    "own_grandchild_of_three": (_own_child(3), "without StyleGAN2's synthesis blocks"),
    # Names: a module's name is part of every tensor's name below it (a 1 MB name, reused through the memo, would
    # cost a megabyte per tensor); and a count of tensors.
    "megabyte_child_name": (
        _snapshot(_module("G", modules=[("x" * 2**20, _module("C"))])),
        "name that is no short",
    ),
    "60k_tensors": (
        _snapshot(
            _module(
                "G",
                params=[
                    (f"w{i}", P.get(0) if i else _tensor(_storage([1.0]), 0, (1,), (1,)) + P.put(0))
                    for i in range(60_000)
                ],
            )
        ),
        "more than 50000 tensors",
    ),  # fmt: skip
    # Tensors only inside their storage, and storages exactly their bytes.
    "storage_offset_2^34": (
        _one_tensor_network(_tensor(_storage([1.0] * 4), 2**34, (4,), (1,))),
        "outside its storage",
    ),
    "size_past_storage": (
        _one_tensor_network(_tensor(_storage([1.0] * 4), 0, (2**40,), (1,))),
        "outside its storage",
    ),
    "expanded_view": (
        _one_tensor_network(_tensor(_storage([1.0]), 0, (2**20, 2**20), (0, 0))),
        "outside its storage",
    ),
    "negative_offset": (_one_tensor_network(_tensor(_storage([1.0]), -8, (1,), (1,))), "malformed shape"),
    "dict_as_storage": (_one_tensor_network(_tensor(P.dict(), 0, (1,), (1,))), "storage is a dict"),
    "tensor_as_storage": (
        _one_tensor_network(_tensor(_tensor(_storage([1.0]), 0, (1,), (1,)), 0, (1,), (1,))),
        "storage is a Tensor",
    ),
    "storage_count_2^40": (
        _one_tensor_network(_tensor(_storage(payload=_payload_with_count(2**40)), 0, (1,), (1,))),
        "declaring 4 values (1099511627776 in its data header)",
    ),  # fmt: skip
    "storage_payload_cut": (
        _one_tensor_network(_tensor(_storage(payload=_storage_payload([1.0] * 64)[:-9]), 0, (1,), (1,))),
        "storage declaring 64 values",
    ),
    "storage_not_bytes": (
        _one_tensor_network(
            _tensor(P.call(P.glob("torch.storage", "_load_from_bytes"), P.text("x")), 0, (1,), (1,))
        ),
        "storage given as a str",
    ),  # fmt: skip
    "views_past_the_file": (_views(300, 4096), "tensors add up to more bytes than the file holds"),
    # What the memo makes cheap to ask for again: a storage's bytes read 1000 times, one state for 2000 modules,
    # one list made into a set 25 times.
    "storage_read_again": (_storage_read_again(1000), "storages add up to more bytes than the file holds"),
    "one_state_for_2000_modules": (_shared_state(2000), "more than 100000 children in all"),
    "one_list_as_25_sets": (_sets_of_one_list(100_000, 25), "more than 2,000,000 pickle opcodes and items"),
    # Data the reader must not recurse into.
    "list_200k_deep": (_in_kwargs(_deep_list(200_000)), "without StyleGAN2's synthesis blocks"),
    "tuple_key": (_in_kwargs(P.dict((P.tuple(P.int(1)), P.int(1)))), "dict key or set item of type tuple"),
    "huge_int_key": (_in_kwargs(P.dict((P.int(2**64), P.int(1)))), "dict key or set item of type int"),
    # BUILD (__setstate__) on anything but a dtype: Tensor.__setstate__ is `set_(storage, offset, size, stride)`.
    "build_on_tensor": (
        _one_tensor_network(
            _tensor(_storage([1.0]), 0, (1,), (1,))
            + P.tuple(_storage([1.0]), P.int(0), P.tuple(P.int(2**40)), P.tuple(P.int(1)))
            + b"b"
        ),
        "sets the state of a Tensor",
    ),  # fmt: skip
    "build_on_module": (
        _snapshot(_module("G") + P.dict((P.text("tensors"), P.int(1))) + b"b"),
        "sets the state of a PersistentObject",
    ),  # fmt: skip
    "build_on_ordered_dict": (
        _in_kwargs(P.call(P.glob("collections", "OrderedDict")) + P.dict() + b"b"),
        "sets the state of a OrderedDict",
    ),  # fmt: skip
    # Opcodes no NVlabs pickle has.
    "inst": (P.file(b"(ibuiltins\nlist\n"), "opcode INST"),
    "obj": (P.file(b"(" + P.glob("builtins", "list") + b"o"), "builtins.list"),
    "newobj_on_ordered_dict": (P.file(P.glob("collections", "OrderedDict") + b")\x81"), "(NEWOBJ)"),
    "ext1": (P.file(b"\x82\x01"), "opcode EXT1"),
    "persistent_id": (P.file(P.text("x") + b"Q"), "persistent id"),
    "reduce_on_a_string": (P.file(P.call(P.text("os.system"), P.text("x"))), "calls a str (REDUCE)"),
    "torch_save_zip": (b"PK\x03\x04" + b"\0" * 64, "a torch.save file (a zip archive)"),
    "protocol_9": (b"\x80\x09N.", "pickle protocol 9"),
    "binbytes8_of_2^62_bytes": (P.file(b"\x8e" + struct.pack("<Q", 2**62)), "truncated"),
    "global_line_without_end": (b"\x80\x03c" + b"x" * 100_000, "ValueError"),
}


_CHILD = textwrap.dedent(
    """
    # Runs the NVlabs reader on each case in this process, printing a JSON line before and after each, so the parent
    # sees a crash (a signal) or a hang as one, at the case that started last. Address space is capped a few GiB
    # above what the imports took: a reader that allocated what a file declares fails here, not on the machine.
    import json, resource, sys, tempfile, time, traceback
    from pathlib import Path
    from pixelsmith.gan.nvlabs import NVlabsPickleError, convert_pickle

    try:
        size = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + (4 << 30), resource.RLIM_INFINITY))
    except (OSError, StopIteration, ValueError):
        pass
    mode, *args = sys.argv[1:]
    if mode == "files":
        cases = ((name, Path(name).read_bytes) for name in args)
    else:
        from tests.test_gan_nvlabs_hostile import mutations
        cases = ((name, lambda data=data: data) for name, data in mutations(int(args[0]), int(args[1])))
    folder = tempfile.TemporaryDirectory()
    for name, data in cases:
        path = Path(folder.name) / "case.pkl"
        path.write_bytes(data())
        print(json.dumps({"start": name}), flush=True)
        began = time.monotonic()
        try:
            convert_pickle(path)
            outcome, message = "loaded", ""
        except NVlabsPickleError as err:
            outcome, message = "refused", str(err)
        except BaseException:
            outcome, message = "escaped", traceback.format_exc()
        seconds = time.monotonic() - began
        print(json.dumps({"case": name, "outcome": outcome, "message": message, "seconds": seconds}), flush=True)
    folder.cleanup()
    """
)


def _run_child(args: list[str], timeout: float) -> dict[str, dict]:
    """{case: {"outcome": loaded | refused | escaped | crashed | hung, "message", "seconds"}} from a child process
    running `_CHILD`; a case the child started and never finished is "crashed" (the child died: its signal) or
    "hung" (the timeout)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CHECKOUT / "src"), str(CHECKOUT)])}
    command = [sys.executable, "-c", _CHILD, *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=CHECKOUT)
        stdout, returncode, stderr = done.stdout, done.returncode, done.stderr
    except subprocess.TimeoutExpired as err:
        stdout = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        returncode, stderr = None, "timed out"
    results: dict[str, dict] = {}
    started = None
    for line in stdout.splitlines():
        record = json.loads(line)
        if "start" in record:
            started = record["start"]
        else:
            results[record.pop("case")] = record
            started = None
    if started is not None:
        outcome = "hung" if returncode is None else f"crashed (exit {returncode})"
        results[started] = {"outcome": outcome, "message": stderr[-2000:], "seconds": None}
    return results


@pytest.fixture(scope="module")
def hostile_results(tmp_path_factory) -> dict[str, dict]:
    """Every HOSTILE file through convert_pickle, in one child process."""
    folder = tmp_path_factory.mktemp("hostile")
    paths = {}
    for name, (data, _) in HOSTILE.items():
        paths[name] = folder / f"{name}.pkl"
        paths[name].write_bytes(data)
    results = _run_child(["files", *map(str, paths.values())], timeout=240)
    return {
        name: results.get(str(path), {"outcome": "not run (an earlier case crashed or hung)"})
        for name, path in paths.items()
    }


@pytest.mark.parametrize("name", list(HOSTILE))
def test_each_hostile_file_is_refused_in_one_paragraph_quickly(hostile_results, name):
    result = hostile_results[name]
    assert result["outcome"] == "refused", f"{name}: {result}"
    _one_paragraph(result["message"])
    assert HOSTILE[name][1] in result["message"], result["message"]
    assert result["seconds"] < 10, result  # what a recursive walk of 2^60 paths or a 64 GiB storage never is


def test_the_dtype_files_read_out_of_bounds_given_numpys_own_dtype_and_scalar(tmp_path):
    """The craft is real: with the reader's allow-list before (numpy's own `dtype`, whose `__setstate__` BUILD then
    calls, and a `scalar` that read the bytes with numpy), the 64 KiB field offset returns whatever lies 64 KiB past the 8 bytes given,
    and the 100 GB one ends the process with SIGSEGV. Run in a child process (no core file), numpy only."""
    for name in ("dtype_field_offset_64KiB", "dtype_field_offset_100GB"):
        (tmp_path / name).write_bytes(HOSTILE[name][0])
    script = textwrap.dedent(
        """
        import pickle, resource, sys
        import numpy as np
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        def scalar(dtype, data):  # the reader's numpy scalar before: a check for object dtypes, then numpy's read
            assert isinstance(dtype, np.dtype) and not dtype.hasobject and isinstance(data, bytes)
            return np.frombuffer(data, dtype=dtype)[0].item()

        class OldAllowList(pickle.Unpickler):
            def find_class(self, module, name):
                return {"dtype": np.dtype, "scalar": scalar}[name]

        for path in sys.argv[1:]:
            print(repr(OldAllowList(open(path, "rb")).load()), flush=True)
        """
    )
    names = ["dtype_field_offset_64KiB", "dtype_field_offset_100GB"]
    done = subprocess.run(
        [sys.executable, "-c", script, *(str(tmp_path / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # the first file gives a value read from past its buffer; the second kills the process with a signal
    assert done.stdout.startswith("(") and done.stdout.count("\n") == 1, done.stdout
    assert done.returncode < 0, (done.returncode, done.stderr[-500:])


def test_walks_visit_each_module_once_and_stop_at_a_cycle(tmp_path):
    for name, modules in [("dag_12_levels", 12), ("own_child", 1), ("own_grandchild_of_three", 3)]:
        path = tmp_path / f"{name}.pkl"
        path.write_bytes(HOSTILE[name][0])
        G = read_pickle(path)["G"]
        assert len(G.modules()) == modules, name  # a shared child listed once, under the first name it has
        assert len(G.tensors()) == (1 if name.startswith("dag") else modules), name  # the DAG: the leaf only


# ---- globals: refused wherever they sit, nothing run ---------------------------------------------------------------

GADGETS = {
    "os.system": lambda marker: P.call(P.glob("os", "system"), P.text(f"touch {marker}")),
    "posix.system": lambda marker: P.call(P.glob("posix", "system"), P.text(f"touch {marker}")),
    "builtins.eval": lambda marker: P.call(P.glob("builtins", "eval"), P.text(f"open({str(marker)!r}, 'w')")),
    "builtins.exec": lambda marker: P.call(P.glob("builtins", "exec"), P.text(f"open({str(marker)!r}, 'w')")),
    "builtins.getattr": lambda marker: P.call(P.glob("builtins", "getattr"), P.glob("os", "system"), P.text("x")),
    "subprocess.Popen": lambda marker: P.call(P.glob("subprocess", "Popen"), P.tuple(P.text("touch"), P.text(str(marker)))),
    "torch.hub.load": lambda marker: P.call(P.glob("torch.hub", "load"), P.text(str(marker.parent)), P.text("x")),
    "torch.utils.cpp_extension.load_inline": lambda marker: P.call(
        P.glob("torch.utils.cpp_extension", "load_inline"), P.text("x"), P.text("int x = 0;")
    ),
    "torch.load": lambda marker: P.call(P.glob("torch", "load"), P.text(str(marker))),
    "torch.serialization.load": lambda marker: P.call(P.glob("torch.serialization", "load"), P.text(str(marker))),
    "torch._utils._rebuild_tensor": lambda marker: P.call(P.glob("torch._utils", "_rebuild_tensor"), P.NONE),
    "torch.Tensor": lambda marker: P.glob("torch", "Tensor") + b")\x81",
    "numpy.load": lambda marker: P.call(P.glob("numpy", "load"), P.text(str(marker))),
    "numpy.testing._private.utils.runstring": lambda marker: P.call(
        P.glob("numpy.testing._private.utils", "runstring"), P.text(f"open({str(marker)!r}, 'w')"), P.dict()
    ),
    "numpy.core.multiarray._reconstruct": lambda marker: P.call(
        P.glob("numpy.core.multiarray", "_reconstruct"), P.NONE
    ),
    "numpy.frombuffer": lambda marker: P.call(P.glob("numpy", "frombuffer"), P.raw(b"\0" * 8)),
    "dnnlib.util.call_func_by_name": lambda marker: P.call(
        P.glob("dnnlib.util", "call_func_by_name"), P.text("os.system")
    ),
    "torch_utils.persistence.persistent_class": lambda marker: P.call(
        P.glob("torch_utils.persistence", "persistent_class"), P.NONE
    ),
}  # fmt: skip

WHERE = {
    "top_level": lambda gadget: _snapshot(gadget),
    "in_init_kwargs": _in_kwargs,
    "as_a_tensors_offset": lambda gadget: _one_tensor_network(
        P.call(P.glob("torch._utils", "_rebuild_tensor_v2"), _storage([1.0]), gadget)
    ),
    "inside_a_storages_bytes": lambda gadget: _one_tensor_network(
        _tensor(_storage(payload=_inner_pickle(gadget)), 0, (1,), (1,))
    ),
}


def _inner_pickle(gadget: bytes) -> bytes:
    """A storage's bytes whose first pickle (torch.save's magic number) is the gadget instead."""
    return b"\x80\x02" + gadget + b"." + _storage_payload([1.0])


@pytest.mark.parametrize("where", list(WHERE))
@pytest.mark.parametrize("gadget", list(GADGETS))
def test_a_global_off_the_list_is_refused_unrun_wherever_it_sits(tmp_path, gadget, where):
    marker = tmp_path / "code_ran"
    path = tmp_path / "gadget.pkl"
    path.write_bytes(WHERE[where](GADGETS[gadget](marker)))
    with pytest.raises(NVlabsPickleError) as err:
        convert_pickle(path)
    message = str(err.value)
    _one_paragraph(message)
    assert f"asks for the global {gadget}" in message and "does not load as data only" in message, message
    assert "never runs code" in message
    assert not marker.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["gadget.pkl"]


def test_the_gadgets_run_when_unpickled_the_ordinary_way(tmp_path):
    """The crafts are real: `pickle.loads` runs them (the reader's refusal above is what stops them)."""
    for gadget in ("builtins.eval", "os.system"):
        marker = tmp_path / f"ran_{gadget}"
        pickle.loads(_snapshot(GADGETS[gadget](marker)))
        assert marker.exists(), gadget


# ---- settings from the pickle: cast and range-checked (conv_clamp and the rest) ------------------------------------


@pytest.fixture
def repickle(monkeypatch, tmp_path):
    """edit -> a copy of the resnet fixture, unpickled into editable records and pickled back in NVlabs' own form
    (their `torch_utils.persistence` records; kwargs as `dnnlib.EasyDict`s, as their train.py makes them), with
    `edit(snapshot)` applied; and the protocol to write it with. Stand-ins for NVlabs' two modules, as
    tests/fixtures/nvlabs/make_nvlabs_pickles.py uses: only these record classes run (on our own fixture)."""
    persistence = types.ModuleType("torch_utils.persistence")
    util = types.ModuleType("dnnlib.util")

    class Record:
        def __init__(self, meta: dict):
            self.meta = meta

        def __reduce__(self):
            return (persistence._reconstruct_persistent_obj, (self.meta,))

    def _reconstruct_persistent_obj(meta: dict) -> Record:
        return Record(meta)

    class EasyDict(dict):
        pass

    _reconstruct_persistent_obj.__module__, _reconstruct_persistent_obj.__qualname__ = (
        persistence.__name__,
        "_reconstruct_persistent_obj",
    )
    EasyDict.__module__, EasyDict.__qualname__ = util.__name__, "EasyDict"
    persistence._reconstruct_persistent_obj, util.EasyDict = _reconstruct_persistent_obj, EasyDict
    for name, module in {"torch_utils": types.ModuleType("torch_utils"), "torch_utils.persistence": persistence,
                         "dnnlib": types.ModuleType("dnnlib"), "dnnlib.util": util}.items():  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)

    def make(edit, protocol: int = 4) -> Path:
        snapshot = pickle.loads(RESNET.read_bytes())
        for key in ("G", "G_ema", "D"):
            kwargs = snapshot[key].meta["state"]["_init_kwargs"]
            for name in [k for k, v in kwargs.items() if type(v) is dict]:
                kwargs[name] = EasyDict(kwargs[name])
        edit(snapshot)
        path = tmp_path / f"repickled_{len(list(tmp_path.iterdir()))}.pkl"
        path.write_bytes(pickle.dumps(snapshot, protocol=protocol))
        return path

    return make


def _synthesis(key: str, value):
    def edit(snapshot):
        for network in ("G", "G_ema"):
            snapshot[network].meta["state"]["_init_kwargs"]["synthesis_kwargs"][key] = value

    return edit


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_nvlabs_own_form_loads_easydict_kwargs_at_every_protocol(repickle, protocol):
    converted = convert_pickle(repickle(lambda snapshot: None, protocol))
    assert converted.generator["conv_clamp"] == 256.0 and type(converted.generator["conv_clamp"]) is float
    assert converted.generator["channel_max"] == 16 and converted.discriminator["mbstd_group_size"] == 4
    assert len(converted.state_dicts["G_ema"]) == 64


@pytest.mark.parametrize(
    "value, says",
    [
        ("256", "conv_clamp='256'"),
        (float("nan"), "conv_clamp=nan"),
        (-1.0, "conv_clamp=-1.0"),
        (1e30, "conv_clamp=1e+30"),
        ([256], "conv_clamp=a list"),
        (True, "conv_clamp=True"),
    ],
)
def test_conv_clamp_is_cast_and_range_checked(repickle, value, says):
    with pytest.raises(NVlabsPickleError) as err:
        convert_pickle(repickle(_synthesis("conv_clamp", value)))
    assert f"synthesis_kwargs.{says}" in str(err.value) and "float from 1e-09 to 1e+09" in str(err.value)
    _one_paragraph(str(err.value))


def test_an_int_conv_clamp_becomes_a_float_and_null_stays_null(repickle):
    assert convert_pickle(repickle(_synthesis("conv_clamp", 64))).generator["conv_clamp"] == 64.0
    assert convert_pickle(repickle(_synthesis("conv_clamp", None))).generator["conv_clamp"] is None


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda s: s["G"].meta["state"]["_init_kwargs"].update(z_dim=10**9), "z_dim=1000000000"),
        (lambda s: s["G"].meta["state"]["_init_kwargs"].update(img_resolution=48), "a power of two"),
        (lambda s: s["D"].meta["state"]["_init_kwargs"].update(channel_max="16"), "channel_max='16'"),
        (
            lambda s: s["D"].meta["state"]["_init_kwargs"]["epilogue_kwargs"].update(mbstd_group_size=2.5),
            "mbstd_group_size=2.5",
        ),  # fmt: skip
        (
            lambda s: s["G"].meta["state"]["_init_kwargs"].update(mapping_kwargs=[1] * 3),
            "mapping_kwargs=a list",
        ),
        # In range, but not what the tensors are: laid out on the meta device first, refused before any allocation.
        (_synthesis("channel_max", 8192), "tensors do not match its own settings"),
        (lambda s: s["G_ema"].meta["state"]["_init_kwargs"].update(w_dim=16), "G_ema whose settings differ"),
    ],
)
def test_every_setting_is_cast_and_checked_before_a_network_is_built(repickle, edit, says):
    with pytest.raises(NVlabsPickleError) as err:
        convert_pickle(repickle(edit))
    assert says in str(err.value), str(err.value)
    _one_paragraph(str(err.value))


# ---- the property test: mutated and cut copies of the fixtures -----------------------------------------------------


def mutations(seed: int, count: int):
    """(description, bytes) of `count` damaged copies of the committed fixture pickles, the same for the same seed:
    byte flips anywhere (mostly in tensor values), byte flips at opcodes and their arguments (structure), opcode
    swaps, flips inside a storage's torch.save header, and cuts."""
    rng = random.Random(seed)
    originals = {path.name: path.read_bytes() for path in FIXTURE_PICKLES}
    positions = {name: list(pickletools.genops(data)) for name, data in originals.items()}
    storages = {name: [pos for op, _, pos in ops if op.name == "BINBYTES"] for name, ops in positions.items()}
    opcodes = [op.code.encode("latin-1")[0] for op in pickletools.opcodes]
    kinds = ("flip", "flip_structure", "swap_opcode", "flip_storage_header", "cut")
    for case in range(count):
        name = rng.choice(sorted(originals))
        data = bytearray(originals[name])
        kind = kinds[case % len(kinds)]
        if kind == "cut":
            at = rng.randrange(len(data))
            data, what = data[:at], f"cut at {at}"
        else:
            changed = []
            for _ in range(rng.randint(1, 4)):
                if kind == "flip":
                    at = rng.randrange(len(data))
                elif kind == "flip_structure":
                    at = rng.choice(positions[name])[2] + rng.randrange(0, 5)
                elif kind == "flip_storage_header":
                    at = rng.choice(storages[name]) + 5 + rng.randrange(0, 220)
                else:
                    at = rng.choice(positions[name])[2]
                at = min(at, len(data) - 1)
                data[at] = rng.choice(opcodes) if kind == "swap_opcode" else rng.randrange(256)
                changed.append(f"{at}={data[at]:#04x}")
            what = f"{kind} {' '.join(changed)}"
        yield f"seed {seed} case {case}: {name} {what}", bytes(data)


def _fuzz(seed: int, count: int, timeout: float) -> None:
    results = _run_child(["fuzz", str(seed), str(count)], timeout=timeout)
    bad = {case: r for case, r in results.items() if r["outcome"] not in ("loaded", "refused")}
    replay = (
        f"PIXELSMITH_FUZZ_SEED={seed} replays these; tests.test_gan_nvlabs_hostile.mutations({seed}, {count})"
    )
    assert not bad, f"{replay} gives each case's bytes: {bad}"
    assert len(results) == count, f"{count - len(results)} cases did not run"
    for case, result in results.items():
        assert result["seconds"] < 10, (case, result)
        if result["outcome"] == "refused":
            _one_paragraph(result["message"])
            assert "NVlabs" in result["message"], (case, result["message"])
    outcomes = [r["outcome"] for r in results.values()]
    # both roads are taken: damage the reader refuses, and damage (in tensor values) it loads
    assert outcomes.count("refused") > count // 4 and outcomes.count("loaded") > 0, outcomes


def test_damaged_copies_of_the_fixtures_load_or_are_refused_never_crash_or_hang():
    _fuzz(seed=int(os.environ.get("PIXELSMITH_FUZZ_SEED", "20240")), count=250, timeout=300)


@pytest.mark.slow
def test_many_more_damaged_copies_of_the_fixtures_load_or_are_refused():
    _fuzz(seed=int(os.environ.get("PIXELSMITH_FUZZ_SEED", "7")), count=2000, timeout=900)


# ---- the entry points: the paragraph with exit 2 --------------------------------------------------------------------


@pytest.mark.slow
def test_convert_and_generate_exit_2_with_the_paragraph_on_the_file_that_crashed_them(tmp_path):
    hostile = tmp_path / "net.pkl"
    hostile.write_bytes(HOSTILE["dtype_field_offset_100GB"][0])  # SIGSEGV (exit 139) with the old reader
    dest = tmp_path / "out.ckpt"
    runs = {
        "convert.py": run_cli(["convert.py", f"source={hostile}", f"dest={dest}"], timeout=300),
        "generate.py": run_cli(
            [
                "generate.py",
                f"ckpt_path={hostile}",
                f"outdir={tmp_path / 'images'}",
                f"hydra.run.dir={tmp_path / 'run'}",
                "seeds=0-1",
            ],
            timeout=300,
        ),  # fmt: skip
    }
    for script, done in runs.items():
        assert done.returncode == 2, (script, done.returncode, done.stderr[-2000:])
        err = done.stderr.strip()
        assert err.startswith("error: ") and "numpy dtype other than a plain number" in err, (script, err)
        _one_paragraph(err)
        assert "Traceback" not in done.stdout
    assert not dest.exists() and not list(tmp_path.glob(".out.ckpt*"))
    assert not list(tmp_path.rglob("*.png"))
