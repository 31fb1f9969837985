"""Helpers shared by every ``cmh`` command module.

Exit statuses, JSON output, stderr messages, a progress bar that only shows on
a terminal, error mapping (no traceback ever reaches the user) and click
parameter types for durations, sizes and points in time.

Only the standard library, click and ``cmh``'s face are imported here; tqdm is imported when a
bar is actually shown.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar

import click

from cmh import LATEST_TIME, format_size

if TYPE_CHECKING:
    _SecondsParam = click.ParamType[int | str | None]
    _BytesParam = click.ParamType[int]
    _TimeParam = click.ParamType[float]
else:  # click < 8.2 has no generic ParamType at runtime
    _SecondsParam = _BytesParam = _TimeParam = click.ParamType

#: Every check passed.
EXIT_OK = 0
#: A check failed (mismatch, expired, bad or untrusted signature, unstamped, ...).
EXIT_CHECK_FAILED = 1
#: The command line was wrong (bad option, bad key file, bad duration, ...).
EXIT_USAGE = 2
#: An input could not be read, or is not a valid safetensors file.
EXIT_UNREADABLE = 3
#: Stdout's reader went away (``cmh verify ... | head -1``): 128 + SIGPIPE, the status
#: a shell reports for a tool that SIGPIPE stopped.
EXIT_PIPE_CLOSED = 141

#: What a ``DurationType(allow_never=True)`` option holds for "no expiry".
NEVER = "never"

#: Version of the ``--json`` documents; bumped only on an incompatible change.
JSON_SCHEMA_VERSION = 1

#: Set by the console script's entry point (:func:`cmh.cli.main.main`): the command is the
#: whole process, so its budgets may run from the process's start. Not set when the
#: command runs inside another program (click's test runner, an embedding).
WHOLE_PROCESS = threading.Event()

P = ParamSpec("P")
R = TypeVar("R")


# -- output ----------------------------------------------------------------------------


def envelope(command: str, **fields: Any) -> dict[str, Any]:
    """The fields every ``--json`` document starts with (``schema``, ``command``,
    ``cmh_version``), plus ``fields``."""
    from cmh import __version__

    return {"schema": JSON_SCHEMA_VERSION, "command": command, "cmh_version": __version__, **fields}


#: Set in the click context's ``meta`` once the command printed its document.
_JSON_EMITTED = "cmh.json_emitted"


def emit_json(document: Any) -> None:
    """Print one JSON document on stdout (UTF-8, sorted keys, two-space indent).

    The output is valid UTF-8 whatever the document holds: see :func:`utf8_text`.
    """
    text = json.dumps(_utf8_strings(document), indent=2, sort_keys=True, ensure_ascii=False)
    click.echo(text)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[_JSON_EMITTED] = True


def emit_failure(message: str, exit_code: int) -> None:
    """The document of a ``--json`` command stopped by an error (status 1 or 3) before it
    printed its own: the common fields, ``ok`` false, ``exit_status`` and ``error``."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.meta.get(_JSON_EMITTED):
        return
    names: list[str] = []
    while ctx.parent is not None:  # `mirror add`: every name below `cmh`
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    emit_json(envelope(" ".join(names), ok=False, exit_status=exit_code, error=message))


def utf8_text(text: str) -> str:
    """``text`` as valid Unicode: a file name's undecodable bytes become U+FFFD.

    A name the file system gave as bytes that are not UTF-8 reaches Python with
    each bad byte as a lone surrogate (``surrogateescape``); those bytes, decoded
    with U+FFFD for each maximal invalid subsequence, are what JSON reports
    (spec section 6, "Names in reports").
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogateescape") if _escaped_only(text) else None
        if raw is None:
            raw = text.encode("utf-8", "surrogatepass")
        return raw.decode("utf-8", "replace")


def _escaped_only(text: str) -> bool:
    """Every surrogate in ``text`` is one ``surrogateescape`` made for a byte 0x80-0xFF."""
    return all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF for c in text)


def _utf8_strings(value: Any) -> Any:
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, dict):
        return {
            utf8_text(k) if isinstance(k, str) else k: _utf8_strings(v) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_utf8_strings(v) for v in value]
    return value


def echo(message: str = "") -> None:
    """A line of human output on stdout."""
    click.echo(message)


#: Status words in colour on a terminal, as ``gh`` and the ``hf`` CLI show them.
STATUS_COLOURS = {
    "ok": "green",
    "stamped": "green",
    "FAILED": "red",
    "BAD": "red",
    "ERROR": "red",
    "error": "red",
    "warning": "yellow",
}


def colour_on(err: bool = False) -> bool:
    """Whether to colour: the stream is a terminal and ``NO_COLOR`` is unset or empty
    (https://no-color.org); piped or redirected output stays plain."""
    if os.environ.get("NO_COLOR"):
        return False
    stream = sys.stderr if err else sys.stdout
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def status_word(word: str, err: bool = False) -> str:
    """A status word (a key of :data:`STATUS_COLOURS`), coloured when :func:`colour_on`."""
    if not colour_on(err):
        return word
    return click.style(word, fg=STATUS_COLOURS[word], bold=True)


def warn(message: str) -> None:
    """A warning on stderr, prefixed ``warning:``."""
    click.echo(f"{status_word('warning', err=True)}: {message}", err=True)


def print_error(message: str) -> None:
    """An error on stderr, prefixed ``error:``."""
    click.echo(f"{status_word('error', err=True)}: {message}", err=True)


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 kB``: :func:`cmh.format_size`, the pages' formatter too."""
    return format_size(n)


def iso_utc(ts: float) -> str:
    """Unix seconds as ``2025-01-31T12:00:00Z``."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- progress ----------------------------------------------------------------------------


def stderr_is_terminal() -> bool:
    """True when stderr is an interactive terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


#: Set when Ctrl-C was pressed (cli/_interrupt.py): no bar draws any more.
BARS_STOPPED = threading.Event()


@contextlib.contextmanager
def progress_bar(
    total_bytes: int, desc: str, passes: tuple[str, ...] = ()
) -> Iterator[Callable[[int], None]]:
    """Yield a callback ``advance(nbytes)`` that drives a byte progress bar.

    The bar is a tqdm bar on stderr in decimal units (MB, MB/s), shown only when
    stderr is a terminal; otherwise the callback does nothing and tqdm is not
    imported. The callback may be called from worker threads. With ``passes``
    (e.g. ``("hash", "store")``) the work reads ``total_bytes`` once per pass:
    the bar counts to ``total_bytes`` for each, its label naming the pass.
    """
    if total_bytes <= 0 or not stderr_is_terminal() or BARS_STOPPED.is_set():
        yield _no_progress
        return
    from tqdm import tqdm

    lock = threading.Lock()
    columns, lines = _terminal_size()
    names = list(passes)
    with tqdm(
        total=total_bytes,
        desc=f"{names.pop(0)} {desc}" if names else desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        file=sys.stderr,
        leave=False,
        ncols=columns or 80,
        nrows=lines or 24,
        dynamic_ncols=columns > 0,
        bar_format=_NO_ETA,
    ) as bar:
        eta_shown = False

        def advance(nbytes: int) -> None:
            nonlocal eta_shown
            with lock:
                if BARS_STOPPED.is_set():  # after `interrupted:` the bar stays as it was
                    bar.disable = True
                    return
                if not eta_shown and bar.n >= total_bytes * ETA_AFTER_FRACTION:
                    bar.bar_format, eta_shown = _WITH_ETA, True
                while names and bar.n + nbytes > total_bytes:
                    nbytes -= total_bytes - bar.n
                    bar.reset(total=total_bytes)
                    bar.set_description(f"{names.pop(0)} {desc}", refresh=False)
                bar.update(nbytes)

        try:
            yield advance
        finally:
            if BARS_STOPPED.is_set():
                bar.disable = True  # no last redraw under the `interrupted:` line


@contextlib.contextmanager
def late_progress_bar(desc: str, show: bool = True) -> Iterator[LateBar]:
    """A progress bar whose total is known only once the work has begun (a resolve).

    Yields a :class:`LateBar`: pass ``bar.on_total`` and ``bar.advance`` to the work.
    """
    with contextlib.ExitStack() as stack:
        yield LateBar(desc, show, stack)


class LateBar:
    """The callbacks of :func:`late_progress_bar`."""

    def __init__(self, desc: str, show: bool, stack: contextlib.ExitStack) -> None:
        self.desc = desc
        self.show = show
        self._stack = stack
        self._advance: Callable[[int], None] = _no_progress

    def on_total(self, total: int) -> None:
        """Open the bar for ``total`` bytes."""
        if self.show:
            self._advance = self._stack.enter_context(progress_bar(total, self.desc))

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more are done."""
        self._advance(nbytes)


#: The bar's ETA appears once this share is done: before, the rate says nothing yet (a
#: server hashing before it sends, a connection warming up) and the ETA would be absurd.
ETA_AFTER_FRACTION = 0.02
_WITH_ETA = "{l_bar}{bar}| {n_fmt}B/{total_fmt}B [{elapsed}<{remaining}, {rate_fmt}]"
_NO_ETA = "{l_bar}{bar}| {n_fmt}B/{total_fmt}B [{elapsed}, {rate_fmt}]"


def _terminal_size() -> tuple[int, int]:
    """Columns and lines of the terminal on stderr; 0 when it does not say (a fresh pty)."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return 0, 0
    return size.columns, size.lines


def _no_progress(nbytes: int) -> None:
    del nbytes


@contextlib.contextmanager
def report_waits() -> Iterator[None]:
    """Within the block, a request with no answer yet is told on stderr within seconds.

    ``waiting for GET http://...: no answer yet after 3 s (try 1 of 6)``, then one line
    per retry (``..., retry 2 of 6 in 1 s``); the same line is not repeated.
    """
    from cmh.hub.resolver import add_wait_listener

    said: set[str] = set()
    lock = threading.Lock()

    def tell(message: str) -> None:
        with lock:
            if message in said:
                return
            said.add(message)
        click.echo(f"waiting for {message}", err=True)

    remove = add_wait_listener(tell)
    try:
        yield
    finally:
        remove()


def check_hub_url(url: str | None, what: str) -> None:
    """A usage error at once for a Hub URL without ``http://`` or ``https://``."""
    if url is None:
        return
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:  # an unclosed IPv6 bracket: 'http://[::1'
        usage_error(f"{what} {url!r} is not a URL: {exc}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        usage_error(
            f"{what} {url!r} is not a URL: give the scheme and host, e.g. "
            f"http://{url.strip().split('://')[-1] or 'localhost:8080'} or https://huggingface.co"
        )


# -- errors ------------------------------------------------------------------------------


class CommandError(click.ClickException):
    """A failure reported as ``error: <message>`` on stderr with a chosen exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_CHECK_FAILED) -> None:
        super().__init__(message)
        # click declares exit_code a class variable; the instance value is what it exits with.
        setattr(self, "exit_code", exit_code)  # noqa: B010

    def show(self, file: Any = None) -> None:
        print_error(self.format_message())


def fail(message: str, exit_code: int = EXIT_CHECK_FAILED) -> NoReturn:
    """Stop the command: print ``error: message`` on stderr and exit with ``exit_code``."""
    raise CommandError(message, exit_code)


def usage_error(message: str) -> NoReturn:
    """Stop the command with a usage error (exit status 2)."""
    raise CommandError(message, EXIT_USAGE)


def exit_code_for(exc: BaseException) -> int:
    """The exit status for a library or OS error.

    Unreadable or invalid inputs and storage errors (``ObjectStoreError``: the storage
    failed or cannot be reached) give 3, bad keys, durations, sizes and store URLs 2,
    every other cmh error 1.
    """
    from cmh import InputValueError, InvalidFileError, SigningKeyError

    if isinstance(exc, (SigningKeyError, InputValueError)):
        return EXIT_USAGE
    if isinstance(exc, (InvalidFileError, OSError)):
        return EXIT_UNREADABLE
    stores = sys.modules.get("cmh.hub.mirror.stores")  # loaded if the error can be a storage's
    if stores is not None and isinstance(exc, stores.ObjectStoreError):
        return EXIT_USAGE if isinstance(exc, stores.InvalidLocation) else EXIT_UNREADABLE
    return EXIT_CHECK_FAILED


def describe_os_error(exc: OSError) -> str:
    """``path: No such file or directory`` rather than ``[Errno 2] ...``."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (a write to it fails with EPIPE)."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (click's test runner)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def quit_closed_stdout() -> NoReturn:
    """Stop at once and quietly, as a tool that SIGPIPE stops: stdout's reader has gone.
    Stdout is pointed at ``/dev/null`` so that nothing left in its buffer fails again at
    exit (Python would print ``Exception ignored ... BrokenPipeError`` and exit 120)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    finally:
        os.close(null)
    raise SystemExit(EXIT_PIPE_CLOSED)


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorate a command callback: cmh and OS errors become a message and an exit status.

    ``CMHError`` and ``OSError`` are mapped by :func:`exit_code_for`; Ctrl-C
    exits 130. No traceback reaches the user. With ``--json``, an error that ends
    the command with status 1 or 3 before it printed its document prints one
    (:func:`emit_failure`); a usage error (2) prints nothing on stdout.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return _mapped(func, *args, **kwargs)
        except click.ClickException as exc:
            if kwargs.get("as_json") and exc.exit_code in (EXIT_CHECK_FAILED, EXIT_UNREADABLE):
                emit_failure(exc.format_message(), exc.exit_code)
            raise

    return wrapper


def _mapped(func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``func(*args, **kwargs)``, its cmh and OS errors raised as :class:`CommandError`."""
    from cmh import CMHError

    try:
        return func(*args, **kwargs)
    except (click.ClickException, click.exceptions.Exit, click.Abort):
        raise
    except CMHError as exc:
        raise CommandError(str(exc), exit_code_for(exc)) from None
    except BrokenPipeError as exc:
        if stdout_closed():  # ``cmh ... | head``: not an error of the command's
            quit_closed_stdout()
        raise CommandError(describe_os_error(exc), EXIT_UNREADABLE) from None
    except OSError as exc:
        raise CommandError(describe_os_error(exc), EXIT_UNREADABLE) from None
    except KeyboardInterrupt:
        print_error("interrupted")
        raise click.exceptions.Exit(130) from None


# -- parameter types ---------------------------------------------------------------------


#: The longest duration an option takes (10000 years): longer ones mean nothing, and
#: from about 10**308 s on no float holds them.
MAX_DURATION = 10_000 * 365 * 86400


class DurationType(_SecondsParam):
    """A duration such as ``90s``, ``12h``, ``30d``, ``1d12h`` -> seconds (``int``), at
    most :data:`MAX_DURATION`.

    With ``allow_never``, ``never`` is accepted and converts to :data:`NEVER`
    (the string ``"never"``), so "not given" (``None``) stays distinct. With
    ``ends_by`` (Unix seconds), a duration from now must end by then.
    """

    name = "duration"

    def __init__(self, allow_never: bool = False, ends_by: int | None = None) -> None:
        self.allow_never = allow_never
        self.ends_by = ends_by

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, int):
            return value
        text = str(value)
        if self.allow_never and text.strip().lower() == NEVER:
            return NEVER
        from cmh import DurationError, parse_duration

        try:
            seconds = parse_duration(text)
        except DurationError as exc:
            self.fail(str(exc), param, ctx)
        if self.ends_by is not None and seconds > self.ends_by - time.time():
            self.fail(
                f"{text!r} from now ends after {iso_utc(self.ends_by)}, the last time a record "
                "holds (an unsigned 32-bit Unix time): use a shorter TTL, or never",
                param,
                ctx,
            )
        if seconds > MAX_DURATION:
            self.fail(f"{text!r} is longer than 10000 years", param, ctx)
        return seconds


class SizeType(_BytesParam):
    """A size such as ``500M``, ``20GB``, ``1.5GiB`` -> bytes (``int``)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, int):
            return value
        from cmh import SizeError, parse_size

        try:
            return parse_size(str(value))
        except SizeError as exc:
            self.fail(str(exc), param, ctx)


#: The times a ``--at`` may name: 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z (printable).
TIME_RANGE = (0.0, 253402300799.0)


class TimeType(_TimeParam):
    """A point in time -> Unix seconds (``float``), within :data:`TIME_RANGE`.

    Accepts Unix seconds (``1767225600``), ISO 8601 (``2026-01-01``,
    ``2026-01-01T12:00:00Z``; no zone means UTC), ``now``, and an offset from
    now (``+30d``, ``-12h``).
    """

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, (int, float)):
            return value
        seconds = self._seconds(str(value).strip(), param, ctx)
        low, high = TIME_RANGE
        if not low <= seconds <= high:  # also NaN
            self.fail(f"{value!r} is not a time from {iso_utc(low)} to {iso_utc(high)}", param, ctx)
        return seconds

    def _seconds(
        self, text: str, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """``text`` as Unix seconds, not yet checked against :data:`TIME_RANGE`."""
        if text.lower() == "now":
            return time.time()
        try:
            return float(text)  # also -12, 1e300, inf, nan
        except ValueError:
            pass
        if text[:1] in "+-" and len(text) > 1:
            from cmh import DurationError, parse_duration

            try:
                offset = parse_duration(text[1:])
            except DurationError as exc:
                self.fail(str(exc), param, ctx)
            offset = min(offset, 2 * int(TIME_RANGE[1]))  # out of range either way, a float
            return time.time() + (offset if text[0] == "+" else -offset)
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            self.fail(
                f"invalid time {text!r}: use Unix seconds, ISO 8601 (2026-01-01T12:00:00Z), "
                "now, or an offset like +30d",
                param,
                ctx,
            )
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.timestamp()


#: Shared instances for ``type=`` in click options.
DURATION = DurationType()
#: A stamp's lifetime: ``never``, or a duration that ends by the record's last time.
TTL = DurationType(allow_never=True, ends_by=LATEST_TIME)
SIZE = SizeType()
TIME = TimeType()


def json_option(func: Callable[P, R]) -> Callable[P, R]:
    """The standard ``--json`` flag (parameter name ``as_json``)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print one JSON document (schema in docs/cli.md) instead of text.",
    )(func)
