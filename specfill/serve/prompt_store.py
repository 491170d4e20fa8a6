"""The prompt cache's disk store (`specfill serve --prompt-cache-dir DIR`).

One safetensors file per conversation, `<hash of its tokens>.safetensors`: tensors "keys" and
"values" [n_layers, Hkv, slots, D] in the model's dtype and "positions" [slots] (int64, each
slot's RoPE position), written by the backend's KVCache.save; its header's metadata (str -> str):
  format    "specfill-prompt-cache/2" (a file of another specfill version's format is skipped)
  content   "sha256:<hex>": the hash of the whole file as written with this value "sha256:" + 64
            zeros (header and tensors; the value has one length, so the hash is filled in place after
            the backend wrote the file); checked when the entry's KV is read, a mismatch is a miss
  identity  JSON: the model (its --model spec or path), backend, dtype, layers, KV heads, head size,
            vocabulary and context length; a file of another identity is skipped
  tokens    JSON list of the conversation's token ids
  slots, position_offset  the KV's slots and RoPE offset past them (core/runtime.KVState)
  exact     "1": a dense KV (reused under either policy); "0": from sparse prefill, approximate only
  fixed     the shortest prefix the KV may be cut to (prompt_cache.Entry.fixed)
  hybrid    a hybrid model's file only (core/io/hybrid_state.py): its recurrent layers' state at a
            prompt-end mark, tensors "recurrent.<layer>.<member>"; the file's KV stops at that mark
            (KVCache.save_point), the one point it can be reused at (prompt_cache.Entry.whole)
The SpecPrefill speculator's dense KV of a conversation (KVState.speculator: SpecPrefill from a
reused prefix, docs/methods.md) is written beside it, `<hash>.speculator.safetensors` (its
`slots`, and `speculator`: JSON, the speculator's identity, "self:K" or a loaded one's as above),
with the same rules, after the conversation's file (a failure of its own is logged and leaves the
conversation without it); it is read with the conversation's file when its identities match (else
the conversation comes back without it: the next SpecPrefill turn's speculator reads the whole
prompt), and deleted with it.
A file is written to a hidden temporary name in DIR, `.<name>.<pid>.tmp.safetensors`, its content
hash filled in, flushed to the device (fsync) and moved into place with os.replace, then the
directory is flushed too (atomic: a reader, or a server restarted after a crash or a power cut,
sees the whole file or none; a failed write leaves nothing). A temporary file whose writer is gone
(killed mid-write) is deleted when a store is next opened on DIR. At startup only the headers are
read (a corrupt or unreadable file is skipped with one log line naming it; files of another model or
another version with one line for all of each); an entry's KV is read when a prompt reuses it (a
file whose content hash, KV or recurrent part does not fit is then a miss, with one log line). A
directory this process cannot write to is read only (one log line): its entries are reused, nothing
is written or deleted there. The files' bytes are bounded by `max_bytes`: the oldest go first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
from pathlib import Path
from typing import Any

from specfill.core.adapted import AdaptedArgs
from specfill.core.runtime import KVState, save_point

from .prompt_cache import Entry

FORMAT = "specfill-prompt-cache/2"
FAMILY = "specfill-prompt-cache/"  # any version's format starts so
SUFFIX = ".safetensors"
SPECULATOR = ".speculator" + SUFFIX  # a conversation's speculator KV, beside its file
TEMP = ".tmp" + SUFFIX  # a file being written: .<name>.<pid>.tmp.safetensors
CONTENT = "content"  # the header's metadata key of the content hash
UNSEALED = "sha256:" + "0" * 64  # its value while the hash is computed (the module doc)
CHUNK = 1 << 22
log = logging.getLogger("specfill.serve")


def identity(model: Any, name: str | None) -> dict[str, Any]:
    """What a file must match to be reused: the model and the shape and dtype of its KV."""
    args = model.args
    return {
        "model": name,
        "backend": model.backend,
        "dtype": str(model.dtype).rsplit(".", 1)[-1],
        "layers": args.num_hidden_layers,
        "kv_heads": args.num_key_value_heads,
        "head_dim": args.head_dim,
        "vocab": args.vocab_size,
        "context": args.max_position_embeddings,
    } | ({"recurrent": list(args.recurrent_layers)} if isinstance(args, AdaptedArgs) and args.hybrid else {})


def read_header(path: Path) -> dict[str, str]:
    """A safetensors file's metadata, checked against the file's size (ValueError: not a whole file).
    The format is not checked (scan and load tell another version's file from a foreign one)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > min(size - 8, 1 << 28):
            raise ValueError(f"header of {length} bytes in a file of {size}")
        header = json.loads(f.read(length))
    if not isinstance(header, dict):
        raise ValueError("not a safetensors header")
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end != size:
        raise ValueError(f"{size} bytes, the header describes {8 + length + end} (truncated?)")
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or not str(meta.get("format", "")).startswith(FAMILY):
        raise ValueError(f"not a {FORMAT} file")
    return meta


def content_hash(path: Path, value: str) -> str:
    """The file's content hash (the module doc) where its header holds `value` as the hash
    (ValueError when the header holds it not exactly once)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        (length,) = struct.unpack("<Q", raw)
        header = f.read(length)
        if header.count(value.encode()) != 1:
            raise ValueError("no content hash in its header")
        digest = hashlib.sha256(raw + header.replace(value.encode(), UNSEALED.encode()))
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def seal(path: Path) -> None:
    """Fill in the content hash of a file written with metadata content = UNSEALED (in place: the
    same length) and flush it to the device."""
    value = content_hash(path, UNSEALED)
    with open(path, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + f.read(length).index(UNSEALED.encode()))
        f.write(value.encode())
        f.flush()
        os.fsync(f.fileno())


def check_content(path: Path, meta: dict[str, str]) -> None:
    """ValueError unless the file's bytes are those its writer hashed."""
    value = meta.get(CONTENT, "")
    if len(value) != len(UNSEALED) or not value.startswith("sha256:") or value == UNSEALED:
        raise ValueError("no content hash in its header")
    if content_hash(path, value) != value:
        raise ValueError("its content differs from what was written (content hash mismatch)")


def sync_directory(directory: Path) -> None:
    """Flush a directory's entries (a rename) to the device; best effort (not every system can)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def running(pid: int) -> bool:
    """Whether a process of this id exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # gone since it was listed: read (and skipped) as such
        return 0.0


class PromptStore:
    """The files of one directory for one model (see the module doc)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        model: Any,
        name: str | None,
        max_bytes: int | None,
        speculator: Any = None,
        speculator_name: str | None = None,
    ):
        """speculator: the server's SpecPrefill speculator ("self:K" or a loaded model; None: no
        speculator KV is written or read), speculator_name its --speculator spec (its identity)."""
        self.directory = Path(directory)
        self.speculator = speculator
        self.speculator_identity: Any = None
        if isinstance(speculator, str):
            self.speculator_identity = speculator
        elif speculator is not None:
            self.speculator_identity = identity(speculator, speculator_name)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.identity = identity(model, name)
        self.max_bytes = max_bytes
        self.writable = os.access(self.directory, os.W_OK | os.X_OK)
        if not self.writable:
            log.warning(
                "prompt cache: %s is read only for this process: its conversations are reused, none is written there",
                self.directory,
            )
        else:
            self.sweep()

    def files(self) -> list[Path]:
        return [p for p in self.directory.glob(f"*{SUFFIX}") if not p.name.startswith(".")]

    def temporary(self, path: Path) -> Path:
        return self.directory / f".{path.stem}.{os.getpid()}{TEMP}"

    def sweep(self) -> None:
        """Delete the temporary files of writers no longer running (killed mid-write)."""
        gone = 0
        for path in self.directory.glob(f".*{TEMP}"):
            pid = path.name[: -len(TEMP)].rsplit(".", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and running(int(pid)):
                continue  # another live process's write in progress
            try:
                path.unlink()
                gone += 1
            except FileNotFoundError:
                pass
            except OSError as err:
                log.warning("prompt cache: cannot delete the temporary file %s: %s", path, err)
        if gone:
            log.info("prompt cache: deleted %d temporary file(s) of an interrupted write in %s", gone, self.directory)

    def free_space(self) -> str:
        """The space left on the directory's device, in words (for a failed write's log line)."""
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            return "its free space unknown"
        return f"{free / 2**20:.1f} MiB free there" if free >= 2**20 else f"{free // 1024} KiB free there"

    @property
    def nbytes(self) -> int:
        total = 0
        for path in self.files():
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total

    def scan(self) -> list[Entry]:
        """The directory's entries for this model, disk-only (their KV unread), oldest first."""
        entries, foreign, versions = [], 0, set()
        for path in sorted(self.files(), key=mtime):
            if path.name.endswith(SPECULATOR):
                continue  # a conversation's speculator KV, read with it
            try:
                meta = read_header(path)
                if meta["format"] != FORMAT:
                    versions.add(meta["format"])
                    continue
                if json.loads(meta["identity"]) != self.identity:
                    foreign += 1
                    continue
                tokens = [int(t) for t in json.loads(meta["tokens"])]
                slots, offset = int(meta["slots"]), int(meta["position_offset"])
                if not 0 < slots + offset <= len(tokens):
                    raise ValueError(f"{slots} + {offset} slots for {len(tokens)} tokens")
                if ("recurrent" in self.identity) != ("hybrid" in meta):
                    raise ValueError("a hybrid model's file without its recurrent state (or the reverse)")
                # oldest first, and older than any entry made from now on (time.monotonic() > 0)
                entries.append(
                    Entry(
                        tokens,
                        None,
                        exact=meta["exact"] == "1",
                        fixed=int(meta["fixed"]),
                        used=-1e9 + len(entries),
                        path=str(path),
                        stored=slots + offset,
                        whole="hybrid" in meta,
                    )
                )
            except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
                log.warning("prompt cache: skipping %s: %s", path, err)
        if versions:
            log.warning(
                "prompt cache: skipping the file(s) in %s of another specfill version (format %s, this one reads %s)",
                self.directory,
                ", ".join(sorted(versions)),
                FORMAT,
            )
        if foreign:
            log.warning(
                "prompt cache: skipping %d file(s) in %s of another model, dtype or backend (not %s)",
                foreign,
                self.directory,
                json.dumps(self.identity, sort_keys=True),
            )
        if entries:
            log.info("prompt cache: %d conversation(s) on disk in %s", len(entries), self.directory)
        return entries

    def path_for(self, tokens: list[int]) -> Path:
        digest = hashlib.sha256(json.dumps([self.identity, tokens]).encode()).hexdigest()[:32]
        return self.directory / f"{digest}{SUFFIX}"

    def write(self, entry: Entry) -> tuple[str, int]:
        """Write an entry's file and its speculator KV's atomically (the module doc): (its path, the
        tokens its file's KV stands for). A hybrid's cache writes its KV up to its latest prompt-end
        mark only. It reads the entry and writes only the entry's own files, so it may run on a
        thread of its own over a private copy of the entry (PromptCache's background write); the
        directory's bound is `evict`'s, on the worker thread."""
        if not self.writable:
            raise PermissionError(f"{self.directory} is read only for this process")
        kv = entry.kv
        slots = save_point(kv.cache, kv.slots)  # a hybrid's cache: where it kept the recurrent state
        path = self.path_for(entry.tokens)
        meta = {
            "format": FORMAT,
            "identity": json.dumps(self.identity, sort_keys=True),
            "tokens": json.dumps(entry.tokens),
            "slots": str(slots),
            "position_offset": str(kv.position_offset),
            "exact": "1" if entry.exact else "0",
            "fixed": str(entry.fixed),
            CONTENT: UNSEALED,
        }
        self._write_sealed(kv.cache, slots, meta, path)
        self._save_speculator(path, entry, slots + kv.position_offset)
        return str(path), slots + kv.position_offset

    def save_speculator(self, entry: Entry) -> None:
        """Write the speculator KV of an entry written before again (grown since: speculator_kv.py)."""
        if self.writable and entry.path is not None:
            self._save_speculator(Path(entry.path), entry, entry.stored)

    def _companion(self, path: Path) -> Path:
        return path.with_name(path.name[: -len(SUFFIX)] + SPECULATOR)

    def _save_speculator(self, path: Path, entry: Entry, tokens: int) -> None:
        """Write the entry's speculator KV beside its file (the module doc); a failure is logged."""
        spec = entry.speculator
        if spec is None or self.speculator_identity is None or min(spec.slots, tokens) < 1:
            return
        slots, target = min(spec.slots, tokens), self._companion(path)
        meta = {
            "format": FORMAT,
            "identity": json.dumps(self.identity, sort_keys=True),
            "speculator": json.dumps(self.speculator_identity, sort_keys=True),
            "slots": str(slots),
            CONTENT: UNSEALED,
        }
        try:
            self._write_sealed(spec.cache, slots, meta, target)
        except Exception as err:  # noqa: BLE001 - the conversation's file stands without it
            log.warning("prompt cache: cannot write the speculator KV %s: %s", target, err)

    def _write_sealed(self, cache: Any, slots: int, meta: dict[str, str], target: Path) -> None:
        """cache's first `slots` slots written to `target` whole or not at all (the module doc): a
        temporary file, sealed, renamed into place, the directory synced."""
        temp = self.temporary(target)
        try:
            cache.save(str(temp), slots, meta)
            seal(temp)
            os.replace(temp, target)
        finally:
            try:
                temp.unlink(missing_ok=True)  # a failed write's (moved into place: gone already)
            except OSError:
                pass  # the next store opened on the directory deletes it
        sync_directory(self.directory)

    def _load_speculator(self, path: Path, tokens: int) -> KVState | None:
        """The speculator KV beside `path`, read back (None: none, another speculator's, or unusable)."""
        target = self._companion(path)
        if self.speculator_identity is None or not target.exists():
            return None
        try:
            meta = read_header(target)
            if meta["format"] != FORMAT or json.loads(meta["identity"]) != self.identity:
                return None
            if json.loads(meta["speculator"]) != json.loads(json.dumps(self.speculator_identity, sort_keys=True)):
                return None
            slots = int(meta["slots"])
            if not 0 < slots <= tokens:
                raise ValueError(f"{slots} slots for {tokens} tokens")
            check_content(target, meta)
            model = self.model.speculator_model(self.speculator)[0]
            cache = self.model.ops.new_cache(model, slots)
            if cache.load(str(target)) != slots:
                raise ValueError(f"the file holds another number of slots than its header's {slots}")
        except Exception as err:  # noqa: BLE001 - the conversation comes back without it
            log.warning("prompt cache: skipping the speculator KV %s: %s", target, err)
            return None
        return KVState(cache, slots)

    def evict(self, keep: str) -> list[str]:
        """Delete the oldest files (`keep`, the one just written, last) until the directory's bytes
        are within the bound; the paths deleted."""
        if self.max_bytes is None:
            return []
        sizes = {}
        for path in sorted(self.files(), key=lambda p: (str(p) == keep, mtime(p))):  # the one just written last
            try:
                sizes[path] = path.stat().st_size
            except OSError:  # gone since it was listed
                pass
        total, gone = sum(sizes.values()), []
        for path, size in sizes.items():
            if total <= self.max_bytes:
                break
            total -= size
            self.delete(str(path))
            gone.append(str(path))
        return gone

    def delete(self, path: str) -> None:
        """Delete a file (nothing in a read-only directory; a failure is logged)."""
        if not self.writable:
            return
        for each in (path, str(self._companion(Path(path)))) if not path.endswith(SPECULATOR) else (path,):
            try:
                os.unlink(each)
            except FileNotFoundError:
                pass
            except OSError as err:
                log.warning("prompt cache: cannot delete %s: %s", each, err)

    def load(self, entry: Entry) -> KVState:
        """The entry's KV read back into a new cache of the model (ValueError / OSError: unusable)."""
        path = Path(entry.path)
        meta = read_header(path)
        if meta["format"] != FORMAT:
            raise ValueError(f"written by another specfill version (format {meta['format']})")
        slots, offset = int(meta["slots"]), int(meta["position_offset"])
        if json.loads(meta["identity"]) != self.identity or json.loads(meta["tokens"]) != entry.tokens:
            raise ValueError("the file changed since it was listed")
        check_content(path, meta)
        cache = self.model.ops.new_cache(self.model.model, slots)
        if cache.load(entry.path) != slots:
            raise ValueError(f"the file holds another number of slots than its header's {slots}")
        if self.writable:
            try:
                os.utime(entry.path)  # recently used: the last to go when the directory is full
            except OSError:
                pass  # its place in the eviction order only
        speculator = self._load_speculator(path, slots + offset) if offset == 0 else None
        return KVState(cache, slots, offset, speculator=speculator)
