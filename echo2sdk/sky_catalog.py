"""`echo2 plan --catalog skypilot:H100,A100:8`: the worker catalog from SkyPilot's price tables.

SkyPilot (the `sky` package, extra ``skypilot``) keeps one CSV price table per cloud,
``~/.sky/catalogs/<schema>/<cloud>/vms.csv`` (under ``$SKY_RUNTIME_DIR`` instead of ``~`` when that is set),
and downloads it from SkyPilot's catalog repository when it is missing or older than the cloud's refresh
period. :func:`sky_catalog` asks ``sky.catalog.list_accelerators`` cloud by cloud and keeps, for each
machine type asked for, the cheapest offering over the clouds and regions: the on-demand price, or the spot
price with ``spot=True``, rows without that price skipped. A machine type is a SkyPilot accelerator name
(``sky gpus list``; matched exactly, case-insensitively) with one accelerator per machine, or ``NAME:N`` for
machines of N.

SkyPilot knows prices, not throughput: each type's ``mu`` (rollouts/s of one machine, measured by a warm-up)
and optionally ``count`` (machines of that type the plan may use; default 1) come from a mu table, ``.toml``
with ``[[gpu]]`` tables or ``.csv`` with a header: ``type, mu, count``.

A cloud whose table SkyPilot cannot read (no cached copy and no network) is left out with a warning; when
no type could be priced anywhere the error says which clouds failed, why, and how to pass a catalog file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import math
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from echo2sdk.errors import ConfigError, DependencyNotInstalled
from echo2sdk.plan import CatalogEntry, _num

__all__ = [
    "PREFIX",
    "DEFAULT_CLOUDS",
    "MachineType",
    "Offering",
    "SkyCatalog",
    "is_sky_spec",
    "parse_types",
    "load_mu_table",
    "cheapest",
    "sky_catalog",
    "format_offerings",
]

PREFIX = "skypilot:"
# The default: GPU clouds whose price table SkyPilot reads as a plain CSV. Nebius and OCI call their APIs when an
# account is configured; they and the rest of sky.catalog's clouds can be named with --clouds (Kubernetes, SSH and
# Slurm have no price tables: refused).
DEFAULT_CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod", "vast", "fluidstack", "paperspace", "cudo", "do",
                  "primeintellect", "hyperbolic")
_NO_PRICES = {"kubernetes", "ssh", "slurm"}
_TYPE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?::([0-9]+))?$")
_CATALOG_FILE = "--catalog FILE.toml ([[worker]] tables) or FILE.csv with columns name, price_per_hour, mu, count"
_HOW_TO_MEASURE = (
    "measure it with a warm-up on one machine of the type (`echo2 run` with [scheduler] enabled = true writes "
    "each worker's rollouts/s to DIR/calibration.json, key \"mu\")"
)

# query(cloud, name_filter, region_filter) -> SkyPilot's {accelerator name: [InstanceTypeInfo, ...]}
Query = Callable[[str, str, "str | None"], dict[str, list[Any]]]


@dataclass(frozen=True)
class MachineType:
    """`per_machine` accelerators named `accelerator` (as SkyPilot spells it, any case) in one machine."""

    accelerator: str
    per_machine: int = 1

    @property
    def name(self) -> str:
        """The catalog name: `h100`, or `h100x8` for machines of 8."""
        base = self.accelerator.lower()
        return base if self.per_machine == 1 else f"{base}x{self.per_machine}"

    @property
    def label(self) -> str:
        return self.accelerator if self.per_machine == 1 else f"{self.accelerator}:{self.per_machine}"


@dataclass(frozen=True)
class Offering:
    """The cheapest place found for a machine type."""

    name: str
    accelerator: str  # SkyPilot's canonical name
    per_machine: int
    cloud: str
    region: str
    instance_type: str
    price_per_hour: float
    spot: bool

    @property
    def source(self) -> str:
        return f"{self.cloud} {self.region} {self.instance_type}, {'spot' if self.spot else 'on-demand'}"


@dataclass
class SkyCatalog:
    """What :func:`sky_catalog` found: the catalog, where each price comes from, and what went wrong."""

    entries: list[CatalogEntry]
    offerings: list[Offering]
    clouds: list[str]  # asked
    read: list[str]  # whose price table SkyPilot read
    spot: bool
    regions: str | None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        mu = {e.name: (e.mu, e.count) for e in self.entries}
        return {
            "clouds": self.clouds, "read": self.read, "spot": self.spot, "regions": self.regions,
            "offerings": [{**asdict(o), "mu": mu[o.name][0], "count": mu[o.name][1]} for o in self.offerings],
            "warnings": self.warnings,
        }


def is_sky_spec(catalog: str) -> bool:
    return catalog.startswith(PREFIX)


def _parse_type(text: str, where: str) -> MachineType:
    m = _TYPE.match(text.strip())
    if not m or (m.group(2) is not None and int(m.group(2)) < 1):
        raise ConfigError(f"{where}: {text!r} is not a machine type: write an accelerator name (H100) or NAME:N for "
                          "N per machine (H100:8)")
    return MachineType(m.group(1), int(m.group(2) or 1))


def parse_types(spec: str) -> list[MachineType]:
    """`skypilot:H100,A100:8` -> [MachineType('H100', 1), MachineType('A100', 8)]."""
    body = spec[len(PREFIX):] if spec.startswith(PREFIX) else spec
    items = [s for s in (p.strip() for p in body.split(",")) if s]
    if not items:
        raise ConfigError(f"--catalog {spec!r}: name the machine types after {PREFIX!r}, e.g. skypilot:H100,L4,A100:8")
    types = [_parse_type(s, f"--catalog {spec!r}") for s in items]
    names = [t.name for t in types]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"--catalog {spec!r}: machine type(s) {dupes} named twice")
    return types


def load_mu_table(path: str | Path) -> dict[str, tuple[float, int]]:
    """{catalog name: (mu, count)} from a mu table: .toml with [[gpu]] tables or .csv with a header, each row
    `type` (H100, or H100:8), `mu` (rollouts/s of one machine) and optionally `count` (default 1)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"mu table {str(path)!r} does not exist")
    if path.suffix.lower() == ".toml":
        try:
            rows = tomllib.loads(path.read_text()).get("gpu")
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
        if not isinstance(rows, list) or not rows:
            raise ConfigError(f"{path}: expected [[gpu]] tables (type, mu, count)")
        where = [f"{path} [[gpu]] #{i + 1}" for i in range(len(rows))]
    elif path.suffix.lower() == ".csv":
        with path.open(newline="") as fh:
            rows = [{k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in r.items() if k}
                    for r in csv.DictReader(fh)]
        if not rows:
            raise ConfigError(f"{path}: no rows (expected a header: type,mu,count)")
        where = [f"{path} row {i + 2}" for i in range(len(rows))]
    else:
        raise ConfigError(f"mu table {str(path)!r}: use a .toml or .csv file")
    table: dict[str, tuple[float, int]] = {}
    for row, at in zip(rows, where):
        if unknown := sorted(set(row) - {"type", "mu", "count"}):
            raise ConfigError(f"{at}: unknown field(s) {unknown} (known: type, mu, count)")
        if row.get("type") in (None, "") or row.get("mu") in (None, ""):
            raise ConfigError(f"{at}: give both 'type' and 'mu' (rollouts/s of one machine)")
        t = _parse_type(str(row["type"]), at)
        if t.name in table:
            raise ConfigError(f"{at}: type {t.label!r} is listed twice")
        count = row.get("count")
        table[t.name] = (_num(row["mu"], "mu", at),
                         int(_num(1 if count in (None, "") else count, "count", at, integer=True)))
    return table


def _price(info: Any, spot: bool) -> float | None:
    value = info.spot_price if spot else info.price
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def cheapest(
    types: Sequence[MachineType], clouds: Iterable[str], query: Query, *, spot: bool = False, regions: str | None = None,
) -> tuple[dict[str, Offering], dict[str, BaseException]]:
    """({catalog name: its cheapest Offering}, {cloud: why its price table could not be read}). `query` is
    asked once per cloud, for all the types at once; a cloud that raises is recorded and skipped. Ties go to
    the first of (price, cloud, region, instance type)."""
    name_filter = "^(?:" + "|".join(re.escape(t.accelerator) for t in types) + ")$"
    wanted = {(t.accelerator.lower(), t.per_machine): t for t in types}
    found: dict[str, tuple[tuple[float, str, str, str], Offering]] = {}
    failed: dict[str, BaseException] = {}
    for cloud in clouds:
        try:
            listing = query(cloud, name_filter, regions)
        except Exception as e:  # noqa: BLE001 - any cloud's failure (network, a broken cached CSV) skips that cloud
            failed[cloud] = e
            continue
        for acc, infos in listing.items():
            for info in infos:
                t = wanted.get((str(acc).lower(), info.accelerator_count))
                price = _price(info, spot)
                if t is None or price is None:
                    continue
                o = Offering(t.name, str(acc), t.per_machine, cloud, str(info.region), str(info.instance_type),
                             price, spot)
                key = (price, o.cloud, o.region, o.instance_type)
                if t.name not in found or key < found[t.name][0]:
                    found[t.name] = (key, o)
    return {name: o for name, (_, o) in found.items()}, failed


class _Records(logging.Handler):
    def __init__(self, cloud: str, notes: list[str]):
        super().__init__(logging.WARNING)
        self.cloud, self.notes = cloud, notes

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.WARNING:  # an ERROR is followed by the exception that cheapest() reports
            self.notes.append(f"SkyPilot ({self.cloud}): {record.getMessage()}")


@contextlib.contextmanager
def _quiet_sky(cloud: str, notes: list[str]) -> Iterator[None]:
    """SkyPilot logs and prints its download spinner to stdout (that would break --json) and leaves
    sys.tracebacklimit at 0 after a failed download (ux_utils.print_exception_no_traceback restores it only
    on success): its warnings go to `notes`, its prints nowhere, and the limit is put back."""
    sky_log = logging.getLogger("sky")
    handlers, sky_log.handlers = sky_log.handlers, [_Records(cloud, notes)]
    had_limit, limit = hasattr(sys, "tracebacklimit"), getattr(sys, "tracebacklimit", None)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        sky_log.handlers = handlers
        if had_limit:
            sys.tracebacklimit = limit
        elif hasattr(sys, "tracebacklimit"):
            del sys.tracebacklimit


def _sky() -> Any:
    try:
        import sky.catalog as catalog  # heavy (~2 s): only when a plan asks for SkyPilot's prices
    except ImportError:
        raise DependencyNotInstalled("skypilot (the catalog of cloud GPU prices)", "skypilot") from None
    return catalog


def _known_clouds(catalog: Any) -> list[str]:
    import pkgutil

    return sorted(m.name.removesuffix("_catalog") for m in pkgutil.iter_modules(catalog.__path__)
                  if m.name.endswith("_catalog") and m.name.removesuffix("_catalog") not in _NO_PRICES)


def _as_list(clouds: Sequence[str] | str | None) -> list[str]:
    if clouds is None:
        return []
    asked = clouds.split(",") if isinstance(clouds, str) else clouds
    return list(dict.fromkeys(c.strip().lower() for c in asked if c.strip()))


def _checked_clouds(clouds: Sequence[str] | str | None, known: list[str]) -> list[str]:
    if clouds is None:
        return [c for c in DEFAULT_CLOUDS if c in known]
    asked = _as_list(clouds)
    if unknown := [c for c in asked if c not in known]:
        raise ConfigError(f"--clouds: unknown cloud(s) {unknown}; SkyPilot prices these: {', '.join(known)}")
    if not asked:
        raise ConfigError("--clouds: name at least one cloud, e.g. --clouds aws,runpod")
    return asked


def _sky_query(catalog: Any, notes: list[str], paths: dict[str, str]) -> Query:
    """SkyPilot's list_accelerators for one cloud at a time (clouds=None would ask every cloud it knows),
    every region, exact names; its warnings go to `notes`, each table's path to `paths`."""
    from sky.catalog import common

    def query(cloud: str, name_filter: str, region_filter: str | None) -> dict[str, list[Any]]:
        paths[cloud] = common.get_catalog_path(f"{cloud}/vms.csv")
        with _quiet_sky(cloud, notes):
            return catalog.list_accelerators(gpus_only=True, name_filter=name_filter, region_filter=region_filter,
                                             clouds=cloud, case_sensitive=False, all_regions=True, require_price=True)

    return query


def _why(e: BaseException, *, url: bool = True, limit: int = 240) -> str:
    """One line for a failure; a failed download (a requests error) as what it fetched and urllib3's reason,
    not its nested repr."""
    fetched = getattr(getattr(e, "request", None), "url", None)
    reason = getattr(e.args[0], "reason", None) if e.args else None
    if fetched and reason is not None:
        text = f"{type(e).__name__}{f' fetching {fetched}' if url else ''}: {type(reason).__name__}: " + str(
            reason.args[0] if reason.args else reason)
    else:
        text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unpriced(types: Sequence[MachineType], failed: dict[str, BaseException], paths: dict[str, str],
              read: list[str], scope: str) -> ConfigError:
    """The error when no type could be priced: which clouds could not be read and why, what the others lack."""
    labels = [t.label for t in types]
    if not failed:
        return ConfigError(f"SkyPilot's price tables offer none of {labels} ({scope}); check the names (`sky gpus "
                           "list`), the count per machine (NAME:N), --clouds and --regions")
    reasons: dict[str, list[str]] = {}
    for cloud, e in failed.items():
        reasons.setdefault(_why(e, url=False), []).append(cloud)
    why = "; ".join(f"{', '.join(clouds)}: {reason}" for reason, clouds in reasons.items())
    cache = {str(Path(p).parent.parent) for p in paths.values()}
    where = f" (SkyPilot caches them under {cache.pop()} and downloads them when missing)" if len(cache) == 1 else ""
    others = f"; the tables of {', '.join(read)} have none of {labels} ({scope})" if read else ""
    return ConfigError(f"SkyPilot could not reach its catalog: no price table for {', '.join(failed)}{where}: {why}"
                       f"{others}. Without network, pass a catalog file instead: {_CATALOG_FILE}")


def sky_catalog(
    spec: str, mu_table: str | Path | None, *, spot: bool = False, clouds: Sequence[str] | str | None = None,
    regions: str | None = None, query: Query | None = None,
) -> SkyCatalog:
    """The worker catalog for `spec` (``skypilot:H100,L4,A100:8``): each type at its cheapest price over
    `clouds` (default DEFAULT_CLOUDS) and the regions matching `regions` (a regular expression searched in the
    region name, case-insensitive), with mu and count from `mu_table`. `query` replaces SkyPilot (tests).
    Raises ConfigError for a bad spec or mu table, or when no type could be priced; DependencyNotInstalled
    without the `sky` package."""
    types = parse_types(spec)
    if mu_table is None:
        raise ConfigError(
            f"--catalog {spec}: SkyPilot gives prices, not throughput; pass --mu-table FILE with each type's mu "
            f"(rollouts/s of one machine): .toml [[gpu]] tables or .csv with columns type, mu, count; "
            f"{_HOW_TO_MEASURE}"
        )
    table = load_mu_table(mu_table)
    if missing := [t.label for t in types if t.name not in table]:
        raise ConfigError(f"{mu_table}: no mu for {missing} (types asked: {[t.label for t in types]}); add a row "
                          f"per type (type, mu); {_HOW_TO_MEASURE}")
    if regions is not None:
        try:
            re.compile(regions)
        except re.error as e:
            raise ConfigError(f"--regions {regions!r} is not a regular expression: {e}") from None
    notes: list[str] = []
    paths: dict[str, str] = {}
    if query is None:
        catalog = _sky()
        clouds = _checked_clouds(clouds, _known_clouds(catalog))
        query = _sky_query(catalog, notes, paths)
    else:
        clouds = _as_list(clouds) or list(DEFAULT_CLOUDS)
    best, failed = cheapest(types, clouds, query, spot=spot, regions=regions)
    warnings = list(notes)
    for cloud, e in failed.items():
        where = f" ({paths[cloud]})" if cloud in paths else ""
        warnings.append(f"SkyPilot could not read {cloud}'s price table{where}: {_why(e)}; planning without {cloud}")
    read = [c for c in clouds if c not in failed]
    kind = "spot" if spot else "on-demand"
    scope = f"{kind} prices, clouds {', '.join(read) or 'none'}" + (f", regions matching {regions!r}" if regions else "")
    if not best:
        raise _unpriced(types, failed, paths, read, scope)
    for t in types:
        if t.name not in best:
            warnings.append(f"no {kind} offering of {t.label} in SkyPilot's price tables ({scope}): left out")
    offerings = [best[t.name] for t in types if t.name in best]
    entries = [CatalogEntry(o.name, o.price_per_hour, table[o.name][0], table[o.name][1], source=o.source)
               for o in offerings]
    return SkyCatalog(entries, offerings, clouds, read, spot, regions, warnings)


def format_offerings(cat: SkyCatalog) -> str:
    """The priced catalog, one line per type, for the top of `echo2 plan`'s report."""
    kind = "spot" if cat.spot else "on-demand"
    regions = f", regions matching {cat.regions!r}" if cat.regions else ""
    out = [f"catalog   SkyPilot {kind} prices, cheapest over {', '.join(cat.read)}{regions}"]
    for e, o in zip(cat.entries, cat.offerings):
        out.append(f"          {e.name:<16} ${e.price_per_hour:<7g}/h  {o.cloud} {o.region} {o.instance_type}  "
                   f"(mu {e.mu:g}, up to {e.count})")
    return "\n".join(out)
