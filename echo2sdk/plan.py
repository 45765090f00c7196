"""`echo2 plan`: the provisioning decision of paper §3.3-3.4 from measured (or estimated) numbers.

Given T_train, T_bcast (or a snapshot size with the learner uplink B0 and worker link Bw, from which
the chain model of :mod:`echo2sdk.sim` estimates it), R, S and a worker catalog, it reports
mu_min(kappa), mu_target = gamma * mu_min, both Delta_max bounds, the cheapest set of workers that
reaches mu_target (:func:`echo2sdk.core.provisioning.provision`, the exact solver by default, with the
paper's greedy rule's cost beside it), its cost per hour and per step, the predicted learner idle
share, and, when the configuration is infeasible, what would fix it.

Catalog files list machine types, one per row: ``name``, ``price_per_hour`` ($/h), ``mu`` (rollouts/s)
and optionally ``count`` (default 1) and ``link_mbps``. TOML: ``[[worker]]`` tables; CSV: a header row.
:mod:`echo2sdk.sky_catalog` builds the same rows from SkyPilot's price tables (``--catalog skypilot:H100,L4``).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from echo2sdk.core import capacity, checks, verdict
from echo2sdk.core.provisioning import Selection, Solver, WorkerOffer, check_solver, provision
from echo2sdk.errors import CapacityError, ConfigError

__all__ = [
    "CatalogEntry",
    "Plan",
    "load_catalog",
    "filter_rate_of",
    "expand",
    "make_plan",
    "idle_share",
    "idle_share_overlap",
    "format_plan",
]

_ALIASES = {"price_per_hour": ("price_per_hour", "usd_per_hour", "$/h", "price"), "mu": ("mu", "rollouts_per_s")}


@dataclass(frozen=True)
class CatalogEntry:
    """One machine type: `count` machines named `name` (or name-0, name-1, ... when count > 1)."""

    name: str
    price_per_hour: float
    mu: float
    count: int = 1
    link_mbps: float | None = None
    source: str | None = None  # where the price comes from (echo2sdk.sky_catalog: "cloud region instance, spot")

    def offers(self) -> list[WorkerOffer]:
        if self.count == 1:
            return [WorkerOffer(self.name, self.price_per_hour, self.mu)]
        return [WorkerOffer(f"{self.name}-{i}", self.price_per_hour, self.mu) for i in range(self.count)]


def _field(row: dict[str, Any], key: str, where: str) -> Any:
    for alias in _ALIASES.get(key, (key,)):
        if alias in row and row[alias] not in (None, ""):
            return row[alias]
    raise ConfigError(f"{where}: missing field {key!r} (columns: name, price_per_hour, mu, count, link_mbps)")


def _num(value: Any, key: str, where: str, *, integer: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: field {key!r} = {value!r} is not a number") from None
    if isinstance(value, bool) or not math.isfinite(x) or x < 0 or (x == 0 and key != "price_per_hour"):
        raise ConfigError(f"{where}: field {key!r} = {value!r} must be a finite number {'>= 0' if key == 'price_per_hour' else '> 0'}")
    if integer and x != int(x):
        raise ConfigError(f"{where}: field {key!r} = {value!r} must be an integer")
    return x


def _entry(row: dict[str, Any], where: str) -> CatalogEntry:
    known = {"name", "count", "link_mbps", *(a for v in _ALIASES.values() for a in v)}
    if unknown := sorted(set(row) - known):
        raise ConfigError(f"{where}: unknown field(s) {unknown} (known: name, price_per_hour, mu, count, link_mbps)")
    name = str(_field(row, "name", where)).strip()
    if not name:
        raise ConfigError(f"{where}: field 'name' is empty")
    count = row.get("count", 1)
    link = row.get("link_mbps")
    return CatalogEntry(
        name=name,
        price_per_hour=_num(_field(row, "price_per_hour", where), "price_per_hour", where),
        mu=_num(_field(row, "mu", where), "mu", where),
        count=int(_num(count if count not in (None, "") else 1, "count", where, integer=True)),
        link_mbps=None if link in (None, "") else _num(link, "link_mbps", where),
    )


def load_catalog(path: str | Path) -> list[CatalogEntry]:
    """Read a worker catalog (.toml with [[worker]] tables, or .csv with a header row)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"worker catalog {str(path)!r} does not exist")
    if path.suffix.lower() == ".toml":
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
        rows = data.get("worker")
        if not isinstance(rows, list) or not rows:
            raise ConfigError(f"{path}: expected [[worker]] tables (name, price_per_hour, mu, count)")
        entries = [_entry(r, f"{path} [[worker]] #{i + 1}") for i, r in enumerate(rows)]
    elif path.suffix.lower() == ".csv":
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            rows = [{k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in r.items() if k} for r in reader]
        if not rows:
            raise ConfigError(f"{path}: no rows (expected a header: name,price_per_hour,mu,count)")
        entries = [_entry(r, f"{path} row {i + 2}") for i, r in enumerate(rows)]
    else:
        raise ConfigError(f"worker catalog {str(path)!r}: use a .toml or .csv file")
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: machine names must be distinct, got {names}")
    return entries


def filter_rate_of(*, filter_rate: float | None = None, accuracy: float | None = None, reward_shares: str | None = None,
                   filter_from: str | Path | None = None, group_size: int | None = None,
                   prompt_concentration: float | None = None) -> dict[str, Any]:
    """A plan's filter rate (make_plan's filter_rate and filter_rate_source) from `echo2 plan`'s options: `filter_rate`
    as given, or predicted at `group_size` G from `accuracy` (binary rewards), `reward_shares` ("Q1,Q2,...": a
    reward of a few values) or `filter_from`, a run folder whose summary.json gives them (core/verdict.plan_inputs;
    G, when given, plans for another group size than the run's), with `prompt_concentration` NU where the prompts
    are not alike. ConfigError for options that do not go together."""
    given = [name for name, value in (("--filter-rate", filter_rate), ("--accuracy", accuracy),
                                      ("--reward-shares", reward_shares), ("--filter-from", filter_from))
             if value is not None]
    if len(given) > 1:
        raise ConfigError("give only one of --filter-rate, --accuracy, --reward-shares or --filter-from, not "
                          f"{' and '.join(given)}")
    where = None
    if filter_from is not None:
        if prompt_concentration is not None:
            raise ConfigError("--filter-from takes the prompts' concentration from the run; leave "
                              "--prompt-concentration out")
        where = Path(filter_from) / "summary.json"
        try:
            summary = json.loads(where.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--filter-from: cannot read {where}: {e}") from None
        run = verdict.plan_inputs(summary, str(where))
        accuracy, reward_shares, prompt_concentration = (run.get("accuracy"), run.get("reward_shares"),
                                                         run["prompt_concentration"])
        group_size = group_size or run["group_size"]
        given = ["--reward-shares" if reward_shares is not None else "--accuracy"]
    if accuracy is not None or reward_shares is not None:
        if group_size is None:
            raise ConfigError(f"{given[0]} needs --group-size G: a group of G is filtered when its rewards are all one")
        f, source = verdict.predicted_filter_rate(
            group_size, accuracy=accuracy, nu=prompt_concentration, of=where,
            shares=verdict.shares_of(reward_shares) if accuracy is None and reward_shares is not None else None)
        return {"filter_rate": f, "filter_rate_source": source}
    if group_size is not None or prompt_concentration is not None:
        raise ConfigError("--group-size and --prompt-concentration go with --accuracy or --reward-shares")
    return {"filter_rate": filter_rate or 0.0, "filter_rate_source": "given"}


def expand(entries: list[CatalogEntry]) -> list[WorkerOffer]:
    return [o for e in entries for o in e.offers()]


def idle_share(T_train: float, T_bcast: float, R: float, kappa: int, mu_pool: float) -> float:
    """Predicted learner idle share under the overlap model of eq. (1): a publication period lasts
    max(kappa * T_train, T_bcast + kappa * R / mu_pool), of which the learner trains kappa * T_train.
    Zero exactly when eq. (1) holds; 1.0 for an empty pool."""
    if mu_pool <= 0:
        return 1.0
    period = max(kappa * T_train, T_bcast + kappa * R / mu_pool)
    return 1.0 - kappa * T_train / period


def idle_share_overlap(T_train: float, R: float, mu_pool: float) -> float:
    """Predicted learner idle share when workers keep generating under the old snapshot while a new one
    arrives (what echo2sdk's workers do) and staleness does not bind: the learner trains R trajectories
    per T_train and the pool delivers mu_pool, so it idles 1 - mu_pool * T_train / R of the time when
    that is positive. Eq. (1) is the conservative case (no rollouts during dissemination)."""
    if mu_pool <= 0:
        return 1.0
    return max(0.0, 1.0 - mu_pool * T_train / R)


@dataclass
class Plan:
    T_train: float
    T_bcast: float
    T_bcast_source: str
    R: float
    S: int
    kappa: int
    gamma: float
    mu_min: float | None
    mu_target: float | None
    feasible: bool
    chosen: list[dict[str, Any]] = field(default_factory=list)
    workers: int = 0
    mu_pool: float = 0.0
    delta_max_conservative: int | None = None
    delta_max_tightened: int | None = None
    cost_per_hour_workers: float = 0.0
    cost_per_hour_learner: float = 0.0
    cost_per_hour: float = 0.0
    cost_per_step: float = 0.0
    idle_share: float = 0.0
    idle_share_overlap: float = 0.0
    solver: str = "exact"  # which solver chose the workers: "exact" (min-cost cover) or "greedy" (§3.4)
    cost_per_hour_workers_exact: float = 0.0  # the workers' $/h as the exact solver picks them
    cost_per_hour_workers_greedy: float = 0.0  # ... and as the paper's greedy rule picks them
    warnings: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    filter_rate: float = 0.0  # f: the share of groups dynamic sampling drops; the pool is sized on useful rollouts
    filter_rate_source: str = ""  # "given", or the accuracy and group size it was predicted from
    R_raw: float = 0.0  # rollouts generated per step for R useful ones: R / (1 - f)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _estimate(n: int, snapshot_gb: float, B0: float | None, Bw: float, chunk_mb: float, install_s: float, q: float,
              delta_ratio: float | None = None, anchor_every: int = 10) -> float:
    from echo2sdk.sim import GB, Network, measure_t_bcast

    net = Network(snapshot_bytes=snapshot_gb * GB, B0_mbps=B0, chunk_bytes=chunk_mb * 2**20, install_s=install_s,
                  delta_ratio=delta_ratio, anchor_every=anchor_every)
    return measure_t_bcast(max(1, n), net.typical(), Bw, q)  # with deltas: the mean publication over a cycle


def _t_bcast_model(
    T_bcast: float | None, snapshot_gb: float | None, B0_mbps: float | None, Bw_mbps: float | None,
    chunk_mb: float, install_s: float, gamma: float, delta_ratio: float | None = None, anchor_every: int = 10,
) -> tuple[Callable[[list[WorkerOffer]], float] | None, str]:
    """(estimate of T_bcast for a set of workers, or None when T_bcast is given; where T_bcast comes from)."""
    if T_bcast is not None:
        return None, "given"
    if snapshot_gb is None or Bw_mbps is None:
        raise ConfigError("give T_bcast, or snapshot_gb with Bw_mbps (and B0_mbps) to estimate it")
    capacity.num_chains(B0_mbps, Bw_mbps) if B0_mbps is not None else None  # validates B0 >= Bw

    def estimate(workers: list[WorkerOffer]) -> float:
        return _estimate(len(workers), snapshot_gb, B0_mbps, Bw_mbps, chunk_mb, install_s, 1 / gamma,
                         delta_ratio, anchor_every)

    b0 = B0_mbps if B0_mbps is not None else "unlimited"
    deltas = "" if delta_ratio is None else f", deltas of {delta_ratio:g} x the snapshot with an anchor every {anchor_every}"
    return estimate, f"chain model: {snapshot_gb:g} GB, B0={b0} Mbit/s, Bw={Bw_mbps:g} Mbit/s{deltas}"


def make_plan(
    catalog: list[CatalogEntry],
    *,
    T_train: float,
    R: float,
    S: int,
    kappa: int | None = None,
    gamma: float = 1.1,
    T_bcast: float | None = None,
    snapshot_gb: float | None = None,
    B0_mbps: float | None = None,
    Bw_mbps: float | None = None,
    chunk_mb: float = 64.0,
    install_s: float = 0.0,
    learner_price_per_hour: float = 0.0,
    solver: Solver = "exact",
    delta_ratio: float | None = None,
    anchor_every: int = 10,
    filter_rate: float = 0.0,
    filter_rate_source: str = "given",
) -> Plan:
    """The provisioning decision; see the module docstring. The workers are chosen by `solver`
    ("exact" or "greedy"); the other solver's cost is reported beside it. With a `filter_rate` f (dynamic
    sampling drops that share of the groups) the pool is sized on useful rollouts: R / (1 - f) generated a step,
    so mu_min and mu_target are in raw rollouts/s. Raises CapacityError / ConfigError naming the bad input; an
    infeasible configuration is a Plan with feasible=False and fixes, not an error."""
    kappa, solver = _checked(S, kappa, gamma, T_train, R, solver, learner_price_per_hour)
    R_useful, R = R, capacity.raw_rate(R, filter_rate)
    offers = expand(catalog)
    if not offers:
        raise ConfigError("the worker catalog is empty")
    estimate, source = _t_bcast_model(T_bcast, snapshot_gb, B0_mbps, Bw_mbps, chunk_mb, install_s, gamma,
                                      delta_ratio, anchor_every)
    decide = functools.partial(provision, offers, T_train=T_train, R=R, kappa=kappa, gamma=gamma, t_bcast=T_bcast,
                               estimate_t_bcast=estimate)
    exact, greedy = decide(solver="exact"), decide(solver="greedy")  # both costs are reported
    best = exact if solver == "exact" else greedy
    tb = best.T_bcast
    plan = Plan(T_train=float(T_train), T_bcast=float(tb), T_bcast_source=source, R=float(R_useful), S=S, kappa=kappa,
                gamma=float(gamma), mu_min=best.mu_min, mu_target=None, feasible=best.feasible, solver=solver,
                cost_per_hour_workers_exact=exact.selection.cost_per_hour,
                cost_per_hour_workers_greedy=greedy.selection.cost_per_hour, filter_rate=float(filter_rate),
                filter_rate_source=filter_rate_source if filter_rate else "", R_raw=float(R))
    plan.cost_per_hour_learner = float(learner_price_per_hour)
    plan.delta_max_tightened = capacity.delta_max_tightened(T_train, tb, kappa)
    sel = best.selection
    _fill(plan, sel, {o.name: e for e in catalog for o in e.offers()})
    if best.mu_min is None:  # the whole catalog is the best it can do; say how much the learner would idle
        plan.warnings.append(
            f"infeasible: kappa*T_train = {kappa}*{T_train:g} s = {kappa * T_train:g} s <= T_bcast = {tb:g} s; "
            "no number of workers can keep the learner busy"
        )
        _fixes(plan, catalog, offers, estimate, learner_price_per_hour)
        return plan
    plan.mu_target = sel.mu_target
    if not sel.feasible:
        _warn_short(plan, sel, catalog, offers, estimate, learner_price_per_hour)
    _warn_staleness(plan, S)
    return plan


def _warn_short(plan: Plan, sel: Selection, catalog: list[CatalogEntry], offers: list[WorkerOffer], estimate: Any,
                learner_price: float) -> None:
    """The whole catalog misses mu_target (`sel`, the selection): the warning, the fixes, and whether filtering
    alone makes it short (the catalog would reach the target on the useful rollouts R)."""
    plan.warnings.append(
        f"infeasible: the whole catalog delivers mu_pool = {sel.mu_pool:.4g} rollouts/s < mu_target = "
        f"{sel.mu_target:.4g} (short by {sel.shortfall:.4g}); the learner will idle about "
        f"{100 * plan.idle_share:.1f}% of the time"
    )
    _fixes(plan, catalog, offers, estimate, learner_price)
    f = plan.filter_rate
    if f and sum(o.mu for o in offers) >= capacity.mu_target(
            capacity.mu_min(plan.T_train, plan.T_bcast, plan.R, plan.kappa), plan.gamma):
        plan.warnings.append(
            f"short because of filtering: only {100 * (1 - f):.0f}% of the rollouts are useful (f = "
            f"{f:.3g}); without it the catalog would suffice")


def _checked(
    S: int, kappa: int | None, gamma: float, T_train: float, R: float, solver: Solver, learner_price_per_hour: float
) -> tuple[int, Solver]:
    """(kappa, solver) once every input is valid: kappa from S (capacity.publication_period); CapacityError /
    ConfigError naming a bad one."""
    kappa = capacity.publication_period(S, kappa)
    capacity.mu_target(1.0, gamma)  # validates gamma
    capacity.mu_min(T_train, 0.0, R, kappa)  # validates T_train and R
    solver = check_solver(solver)
    checks.real("learner price ($/h)", learner_price_per_hour, lo=0, error=CapacityError)
    return kappa, solver


def _warn_staleness(plan: Plan, S: int) -> None:
    """Warn when the overlap staleness bound Delta_max exceeds the window S."""
    if plan.delta_max_tightened is not None and plan.delta_max_tightened > S:
        plan.warnings.append(
            f"the overlap staleness bound Delta_max <= {plan.delta_max_tightened} exceeds S = {S}: rollouts of a "
            "snapshot may age out of the window before they are used; raise S or shorten T_bcast"
        )


def _fill(plan: Plan, sel: Selection, origin: dict[str, CatalogEntry]) -> None:
    counts: dict[str, int] = {}
    for o in sel.chosen:
        counts[origin[o.name].name] = counts.get(origin[o.name].name, 0) + 1
    entries = sorted({origin[o.name] for o in sel.chosen}, key=lambda e: (e.price_per_hour / e.mu, e.name))
    plan.chosen = [
        {"name": e.name, "count": counts[e.name], "price_per_hour": e.price_per_hour, "mu": e.mu,
         "rho": e.price_per_hour / e.mu, **({"source": e.source} if e.source else {})}
        for e in entries
    ]
    plan.workers = len(sel.chosen)
    plan.mu_pool = sel.mu_pool
    plan.cost_per_hour_workers = sel.cost_per_hour
    plan.cost_per_hour = plan.cost_per_hour_learner + sel.cost_per_hour
    plan.idle_share = idle_share(plan.T_train, plan.T_bcast, plan.R_raw, plan.kappa, sel.mu_pool)
    plan.idle_share_overlap = idle_share_overlap(plan.T_train, plan.R_raw, sel.mu_pool)
    step_s = plan.T_train / (1 - plan.idle_share) if plan.idle_share < 1 else math.inf
    plan.cost_per_step = plan.cost_per_hour * step_s / 3600
    if sel.mu_pool > 0:
        plan.delta_max_conservative = capacity.delta_max_conservative(plan.T_train, plan.T_bcast, plan.R_raw, plan.kappa,
                                                                      sel.mu_pool)


def _fixes(plan: Plan, catalog: list[CatalogEntry], offers: list[WorkerOffer], estimate: Any, learner_price: float) -> None:
    """What would make the configuration feasible: more workers, a larger S, a faster broadcast."""
    best = min(catalog, key=lambda e: (e.price_per_hour / e.mu, e.name))
    all_mu = sum(o.mu for o in offers)
    k, T, R = plan.kappa, plan.T_train, plan.R_raw
    if plan.mu_target is not None:
        more = math.ceil((plan.mu_target - all_mu) / best.mu - 1e-9)
        plan.fixes.append(
            f"more workers: about {more} more like {best.name!r} (${best.price_per_hour:g}/h, {best.mu:g} rollouts/s) "
            f"to reach mu_target = {plan.mu_target:.4g}"
        )
    for S2 in range(plan.S + 1, plan.S + 33):
        try:
            m2 = capacity.mu_min(T, plan.T_bcast, R, S2 - 1)
        except CapacityError:
            continue
        if all_mu >= capacity.mu_target(m2, plan.gamma):
            plan.fixes.append(f"larger staleness: S = {S2} (kappa = {S2 - 1}) makes the current catalog sufficient")
            break
    # the broadcast that would let the whole catalog suffice: T_bcast < kappa*T_train - gamma*kappa*R/mu_all
    limit = k * T - plan.gamma * k * R / all_mu
    if limit > 0:
        msg = f"faster dissemination: T_bcast below {limit:.4g} s (now {plan.T_bcast:.4g} s) makes the current catalog sufficient"
        if estimate is not None:
            msg += "; more uplink (B0) adds chains, a faster worker link (Bw) shortens each one"
        plan.fixes.append(msg)
    else:
        plan.fixes.append(
            f"even with T_bcast = 0 the catalog ({all_mu:.4g} rollouts/s) is short of gamma*R/T_train = "
            f"{plan.gamma * R / T:.4g}: add workers"
        )


def format_plan(plan: Plan) -> str:
    """Plain-text report of a Plan."""
    out = [
        f"inputs    T_train = {plan.T_train:g} s, T_bcast = {plan.T_bcast:.4g} s ({plan.T_bcast_source}), "
        f"R = {plan.R:g}, S = {plan.S}, kappa = {plan.kappa}, gamma = {plan.gamma:g}",
    ]
    if plan.filter_rate:
        out.append(f"filtering f = {plan.filter_rate:.3g} of the groups have zero reward variance "
                   f"({plan.filter_rate_source}): R = {plan.R:g} useful rollouts a step take {plan.R_raw:.4g} generated; "
                   "the pool is sized on useful rollouts (rates below are raw)")
    if plan.mu_min is not None:
        out.append(f"capacity  mu_min = {plan.mu_min:.4g} rollouts/s, mu_target = {plan.mu_target:.4g} rollouts/s")
    cons = "n/a" if plan.delta_max_conservative is None else plan.delta_max_conservative
    out.append(f"staleness Delta_max <= {cons} (conservative, eq. 7), <= {plan.delta_max_tightened} (under overlap, B.3)")
    if plan.chosen:
        out.append(f"workers   {plan.workers} chosen, mu_pool = {plan.mu_pool:.4g} rollouts/s (listed by rho = $/h per rollout/s)")
        for c in plan.chosen:
            where = f"  ({c['source']})" if c.get("source") else ""
            out.append(f"          {c['count']:>3} x {c['name']:<16} ${c['price_per_hour']:<7g}/h  mu {c['mu']:<8g} "
                       f"rho {c['rho']:.4g}{where}")
        out.append(
            f"cost      ${plan.cost_per_hour:.4g}/h (workers ${plan.cost_per_hour_workers:.4g}/h + learner "
            f"${plan.cost_per_hour_learner:.4g}/h), ${plan.cost_per_step:.4g} per step"
        )
        exact, greedy = plan.cost_per_hour_workers_exact, plan.cost_per_hour_workers_greedy
        saving = 1 - exact / greedy if greedy > 0 else 0.0
        out.append(
            f"solver    exact ${exact:.4g}/h vs greedy ${greedy:.4g}/h for the workers: exact saves {100 * saving:.1f}% "
            f"(this plan uses {plan.solver})"
        )
    out.append(
        f"learner   predicted idle share {100 * plan.idle_share:.1f}% (eq. 1: no rollouts while a snapshot "
        f"arrives), {100 * plan.idle_share_overlap:.1f}% if workers keep generating meanwhile"
    )
    out.append("feasible  " + ("yes" if plan.feasible else "NO"))
    out += [f"warning   {w}" for w in plan.warnings]
    out += [f"fix       {f}" for f in plan.fixes]
    return "\n".join(out)
