"""Small file helpers: atomic writes (write to a temporary file, then rename) and JSON loading
with errors that name the file and the problem."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile

from .errors import ConfigError, ParallaxError


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one.

    The file gets ``mode`` (default: 0666 less the umask, like ``open``); pass 0o600 for
    files only the owner may read.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ConfigError(f"cannot write {path!r}: it is a folder", hint="name a file to write (a path inside the folder)")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"cannot write {path!r}: a file is in the way of its folder",
                          hint="name a path whose folders are folders") from None
    except OSError as e:
        raise ConfigError(f"cannot write {path!r}: {e.strerror or e}", hint="choose a folder you can write to") from None
    try:
        os.chmod(tmp, _default_mode() if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, (IsADirectoryError, NotADirectoryError, PermissionError)):   # the path, not the disk
            raise ConfigError(f"cannot write {path!r}: {e.strerror or e}", hint="name a file you can write") from None
        raise


def atomic_write_text(path: str, text: str, mode: int | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def dump_json(data: dict, path: str | None = None) -> str:
    """``data`` as indented JSON text; with ``path``, also written there atomically."""
    text = json.dumps(data, indent=2)
    if path is not None:
        atomic_write_text(path, text)
    return text


@contextlib.contextmanager
def reading_fields(source: str):
    """Around building a value from a dict read from a file: a missing field (KeyError) or a
    value of the wrong type or range (TypeError, ValueError) becomes a :class:`ConfigError`
    naming ``source`` and the field or the problem."""
    try:
        yield
    except KeyError as e:
        raise ConfigError(f"{source} lacks field {e.args[0]!r}",
                          hint="regenerate it with this version of parallax_nb") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source} is malformed: {e}", hint="regenerate it with this version of parallax_nb") \
            from None


def load_json(path_or_text: str, what: str = "file") -> dict:
    """Parse JSON from a path, or from text when the argument starts with ``{``."""
    text = path_or_text
    source = "text"
    if not str(path_or_text).lstrip().startswith("{"):
        source = str(path_or_text)
        try:
            with open(path_or_text, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise ParallaxError(f"{what} file not found: {path_or_text}") from None
        except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
            raise ParallaxError(f"cannot read {what} file {path_or_text}: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ParallaxError(f"{what} {source} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})",
                            hint="the file may be truncated or corrupted; regenerate it") from None


def check_schema(d, schema: str, version: int, what: str, error: type = ParallaxError,
                 make_hint: str | None = None, version_hint: str | None = None) -> None:
    """Refuse ``d`` unless it is a dict of ``schema`` at ``version``, with an ``error`` naming
    ``what`` and the value seen (a file of another kind, or of another version of parallax_nb)."""
    if not isinstance(d, dict) or d.get("schema") != schema:
        seen = d.get("schema") if isinstance(d, dict) else type(d).__name__
        raise error(f"not a parallax_nb {what} (expected 'schema': {schema!r}, got {seen!r})", hint=make_hint)
    if d.get("schema_version") != version:
        raise error(f"{what} schema_version {d.get('schema_version')!r} is not supported "
                    f"(this parallax_nb reads version {version})", hint=version_hint)
