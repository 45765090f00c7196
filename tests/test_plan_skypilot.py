"""`echo2 plan --catalog skypilot:...`: the worker catalog from SkyPilot's price tables (echo2sdk.sky_catalog).

The logic is tested in-process against a fake `query`; one subprocess runs the CLI with the real `sky` package
on small price tables in SkyPilot's own CSV columns, in a temporary HOME, with every download refused."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest

from echo2sdk.errors import ConfigError, DependencyNotInstalled
from echo2sdk.plan import format_plan, make_plan
from echo2sdk.sky_catalog import MachineType, load_mu_table, parse_types, sky_catalog

MU_TOML = """
[[gpu]]
type = "H100"
mu = 0.9
count = 4

[[gpu]]
type = "l4"
mu = 0.2
count = 8

[[gpu]]
type = "H100:8"
mu = 6.5
"""
MU_CSV = "type,mu,count\nH100,0.9,4\nl4,0.2,8\nH100:8,6.5,\n"

# SkyPilot's InstanceTypeInfo fields (sky/catalog/common.py)
Info = namedtuple("Info", "cloud instance_type accelerator_name accelerator_count cpu_count device_memory memory "
                          "price spot_price region")


@pytest.fixture
def mu(tmp_path: Path) -> Path:
    path = tmp_path / "mu.toml"
    path.write_text(MU_TOML)
    return path


def test_types_and_mu_tables():
    assert parse_types("skypilot:H100, a100:8,L4") == [MachineType("H100"), MachineType("a100", 8), MachineType("L4")]
    assert [t.name for t in parse_types("skypilot:H100,A100:8")] == ["h100", "a100x8"]
    for spec, message in [("skypilot:", "name the machine types"), ("skypilot:H100:0", "is not a machine type"),
                          ("skypilot:H 100", "is not a machine type"), ("skypilot:H100,h100", r"\['h100'\] named twice")]:
        with pytest.raises(ConfigError, match=message):
            parse_types(spec)


def test_mu_table_toml_and_csv_agree_and_bad_rows_are_named(tmp_path):
    (tmp_path / "mu.toml").write_text(MU_TOML)
    (tmp_path / "mu.csv").write_text(MU_CSV)
    table = load_mu_table(tmp_path / "mu.toml")
    assert table == load_mu_table(tmp_path / "mu.csv") == {"h100": (0.9, 4), "l4": (0.2, 8), "h100x8": (6.5, 1)}
    for text, message in [("type,mu\nH100,0\n", r"row 2: field 'mu' = '0' must be"),
                          ("type,mu,speed\nH100,1,2\n", r"unknown field\(s\) \['speed'\]"),
                          ("type,count\nH100,2\n", "give both 'type' and 'mu'"),
                          ("type,mu\nH100,1\nh100,2\n", "row 3: type 'h100' is listed twice")]:
        (tmp_path / "bad.csv").write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_mu_table(tmp_path / "bad.csv")


TABLES = {
    "runpod": [Info("RunPod", "1x_H100_SECURE", "H100", 1.0, 16, 80, 176, 2.39, 1.99, "CA"),
               Info("RunPod", "1x_L4_SECURE", "L4", 1.0, 12, 24, 50, 0.43, 0.32, "US")],
    "lambda": [Info("Lambda", "gpu_1x_h100_pcie", "H100", 1.0, 26, 80, 200, 2.29, math.nan, "us-west-1")],
    "aws": [Info("AWS", "g6.xlarge", "L4", 1.0, 4, 22, 16, 0.8048, 0.24, "eu-west-1"),
            Info("AWS", "p5.48xlarge", "H100", 8.0, 192, 80, 2048, 98.32, 35.2, "us-east-1")],
}


def fake_query(tables, asked=None):
    def query(cloud, name_filter, region_filter):
        if asked is not None:
            asked.append((cloud, name_filter, region_filter))
        if isinstance(tables[cloud], Exception):
            raise tables[cloud]
        listing = {}
        for info in tables[cloud]:
            listing.setdefault(info.accelerator_name, []).append(info)
        return listing

    return query


def test_cheapest_offering_per_type_on_demand_and_spot(mu):
    asked = []
    cat = sky_catalog("skypilot:H100,L4,H100:8", mu, clouds="runpod,lambda,aws", regions="^(us|ca|eu)",
                      query=fake_query(TABLES, asked))
    assert [(c, r) for c, _, r in asked] == [("runpod", "^(us|ca|eu)"), ("lambda", "^(us|ca|eu)"), ("aws", "^(us|ca|eu)")]
    assert asked[0][1] == "^(?:H100|L4|H100)$"  # one exact, case-insensitive filter for every type
    got = {o.name: (o.cloud, o.region, o.instance_type, o.price_per_hour) for o in cat.offerings}
    assert got == {"h100": ("lambda", "us-west-1", "gpu_1x_h100_pcie", 2.29), "l4": ("runpod", "US", "1x_L4_SECURE", 0.43),
                   "h100x8": ("aws", "us-east-1", "p5.48xlarge", 98.32)}
    assert [(e.name, e.price_per_hour, e.mu, e.count) for e in cat.entries] == [
        ("h100", 2.29, 0.9, 4), ("l4", 0.43, 0.2, 8), ("h100x8", 98.32, 6.5, 1)]
    assert cat.entries[0].source == "lambda us-west-1 gpu_1x_h100_pcie, on-demand" and not cat.warnings
    spot = sky_catalog("skypilot:H100,L4", mu, spot=True, clouds=["runpod", "lambda", "aws"], query=fake_query(TABLES))
    # lambda has no spot price (NaN): skipped, not taken as the cheapest
    assert {o.name: (o.cloud, o.price_per_hour) for o in spot.offerings} == {"h100": ("runpod", 1.99), "l4": ("aws", 0.24)}
    plan = make_plan(spot.entries, T_train=100.0, R=128, S=3, T_bcast=40.0)
    assert "(aws eu-west-1 g6.xlarge, spot)" in format_plan(plan)
    assert plan.chosen[0]["source"] == "aws eu-west-1 g6.xlarge, spot"


def test_unreachable_clouds_warn_and_none_priced_is_an_error(mu):
    down = ConnectionError("Failed to resolve 'raw.githubusercontent.com'")
    cat = sky_catalog("skypilot:H100,L4", mu, clouds="vast,lambda", query=fake_query({**TABLES, "vast": down}))
    assert [o.name for o in cat.offerings] == ["h100"] and cat.read == ["lambda"]
    assert "SkyPilot could not read vast's price table: ConnectionError: Failed to resolve" in cat.warnings[0]
    assert "no on-demand offering of L4 in SkyPilot's price tables (on-demand prices, clouds lambda): left out" in cat.warnings[1]
    with pytest.raises(ConfigError, match=r"SkyPilot could not reach its catalog: no price table for vast, fluidstack: "
                                          r"vast, fluidstack: ConnectionError: .*catalog file instead: --catalog FILE.toml"):
        sky_catalog("skypilot:H100", mu, clouds="vast,fluidstack", query=fake_query({"vast": down, "fluidstack": down}))
    with pytest.raises(ConfigError, match=r"offer none of \['L4'\] \(spot prices, clouds lambda\); check the names"):
        sky_catalog("skypilot:L4", mu, spot=True, clouds="lambda", query=fake_query(TABLES))


def test_mu_is_required_and_sky_is_optional(mu, monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match=r"SkyPilot gives prices, not throughput; pass --mu-table FILE .*calibration.json"):
        sky_catalog("skypilot:H100", None)
    with pytest.raises(ConfigError, match=r"no mu for \['A100'\]"):
        sky_catalog("skypilot:H100,A100", mu)
    with pytest.raises(ConfigError, match="--regions '\\(' is not a regular expression"):
        sky_catalog("skypilot:H100", mu, regions="(")
    monkeypatch.setitem(sys.modules, "sky", None)  # what `import sky` sees when it is not installed
    monkeypatch.setitem(sys.modules, "sky.catalog", None)
    with pytest.raises(DependencyNotInstalled, match=r"pip install \"echo2sdk\[skypilot\]\""):
        sky_catalog("skypilot:H100", mu)


def test_sky_options_need_a_sky_catalog(capsys):
    from echo2sdk.cli import main

    example = str(Path(__file__).resolve().parents[1] / "examples" / "catalog_5090.toml")
    assert main(["plan", "--catalog", example, "--t-train", "1", "--R", "2", "--S", "3", "--t-bcast", "0", "--spot"]) == 2
    assert "--spot: only with --catalog skypilot:TYPES" in capsys.readouterr().err


# -- the real SkyPilot, offline --------------------------------------------------------------------------------
# (cloud, InstanceType, AcceleratorName, AcceleratorCount, Price, SpotPrice, Region, AvailabilityZone)
ROWS = [
    ("aws", "g6.xlarge", "L4", 1, 0.8048, 0.3912, "us-east-1", "use1-az1"),
    ("aws", "g6.xlarge", "L4", 1, 0.8048, 0.2650, "us-east-1", "use1-az2"),
    ("aws", "g6.xlarge", "L4", 1, 0.9800, 0.2400, "eu-west-1", "euw1-az1"),
    ("aws", "p5.48xlarge", "H100", 8, 98.32, 35.20, "us-east-1", "use1-az1"),
    ("runpod", "1x_H100_SECURE", "H100", 1, 2.39, 2.15, "US", "US-KS-2"),
    ("runpod", "1x_H100_SECURE", "H100", 1, 2.39, 1.99, "CA", "CA-MTL-1"),
    ("runpod", "1x_L4_SECURE", "L4", 1, 0.43, 0.32, "US", "US-GA-1"),
    ("lambda", "gpu_1x_h100_pcie", "H100", 1, 2.49, None, "us-east-1", None),
    ("lambda", "gpu_1x_h100_pcie", "H100", 1, 2.29, None, "us-west-1", None),
]
# each cloud's columns, in the order of SkyPilot's fetchers (sky/catalog/data_fetchers)
HEADERS = {
    "aws": "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone,Arch",
    "runpod": "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Region,SpotPrice,Price,AvailabilityZone,GpuInfo",
    "lambda": "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,GpuInfo,SpotPrice",
}


def _write_tables(home: Path) -> Path:
    root = home / ".sky" / "catalogs" / "v8"  # sky.catalog.common.get_catalog_path; v8 = CATALOG_SCHEMA_VERSION
    for cloud, header in HEADERS.items():
        lines = [header]
        for c, itype, acc, n, price, spot, region, az in ROWS:
            if c != cloud:
                continue
            mib = 81559 if acc == "H100" else 22888
            gpu = (f"\"{{'Gpus': [{{'Name': '{acc}', 'Manufacturer': 'NVIDIA', 'Count': {n}, 'MemoryInfo': "
                   f"{{'SizeInMiB': {mib}}}}}], 'TotalGpuMemoryInMiB': {mib * n}}}\"")
            values = {"InstanceType": itype, "AcceleratorName": acc, "AcceleratorCount": f"{n}.0", "vCPUs": "16.0",
                      "MemoryGiB": "64.0", "GpuInfo": gpu, "Price": str(price), "SpotPrice": "" if spot is None else str(spot),
                      "Region": region, "AvailabilityZone": az or "", "Arch": "x86_64"}
            lines.append(",".join(values[k] for k in header.split(",")))
        if cloud == "aws":  # a machine without an accelerator, as most of aws's rows are
            lines.append("m5.large,,,2.0,8.0,,0.096,0.04,us-east-1,use1-az1,x86_64")
        path = root / cloud / "vms.csv"
        path.parent.mkdir(parents=True)
        path.write_text("\n".join(lines) + "\n")
    # runpod's copy as SkyPilot leaves a download: its md5 recorded, now 8 h old (RunPod refreshes every 7 h), so
    # SkyPilot tries to refresh it, fails, and uses the cached copy with a warning. The others were never
    # downloaded (no md5): SkyPilot reads them as they are.
    runpod = root / "runpod" / "vms.csv"
    (root / ".meta" / "runpod").mkdir(parents=True)
    (root / ".meta" / "runpod" / "vms.csv.md5").write_text(hashlib.md5(runpod.read_bytes()).hexdigest())
    old = time.time() - 8 * 3600
    os.utime(runpod, (old, old))
    return root


def _cheapest(acc: str, n: int, spot: bool, clouds: set[str]) -> tuple[str, str, str, float]:
    rows = [(r[5] if spot else r[4], r[0], r[6], r[1]) for r in ROWS
            if r[2] == acc and r[3] == n and r[0] in clouds and (r[5] if spot else r[4]) is not None]
    price, cloud, region, itype = min(rows)
    return cloud, region, itype, price


DRIVER = """
import contextlib, io, json, sys
from echo2sdk.cli import main
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    print(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue()}))
"""


@pytest.mark.skipif(importlib.util.find_spec("sky") is None, reason="needs the skypilot extra")
def test_real_skypilot_reads_cached_price_tables_offline(tmp_path):
    root = _write_tables(tmp_path)
    (tmp_path / "mu.toml").write_text(MU_TOML)
    plan = ["plan", "--mu-table", str(tmp_path / "mu.toml"), "--t-train", "100", "--R", "128", "--S", "3", "--t-bcast", "40"]
    cases = [
        [*plan, "--catalog", "skypilot:H100,L4,H100:8", "--clouds", "runpod,lambda,aws,vast", "--json"],
        [*plan, "--catalog", "skypilot:H100,L4", "--clouds", "aws,runpod,lambda", "--spot", "--json"],
        [*plan, "--catalog", "skypilot:H100,L4", "--clouds", "aws,runpod,lambda", "--spot", "--regions", "^us"],
        [*plan, "--catalog", "skypilot:H100", "--clouds", "vast,fluidstack"],
    ]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k != "SKY_RUNTIME_DIR"}
    dead = "http://127.0.0.1:9"  # every download fails at once
    env.update(HOME=str(tmp_path), HTTPS_PROXY=dead, HTTP_PROXY=dead, AWS_EC2_METADATA_DISABLED="true",
               SKYPILOT_DISABLE_USAGE_COLLECTION="1")
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cases)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    on_demand, spot, spot_us, offline = (json.loads(line) for line in proc.stdout.splitlines())

    assert on_demand["code"] == 0, on_demand["err"]
    data = json.loads(on_demand["out"])  # nothing of SkyPilot's logging or spinner on stdout
    found = {o["name"]: (o["cloud"], o["region"], o["instance_type"], o["price_per_hour"])
             for o in data["skypilot"]["offerings"]}
    three = {"aws", "runpod", "lambda"}
    assert found == {"h100": _cheapest("H100", 1, False, three), "l4": _cheapest("L4", 1, False, three),
                     "h100x8": _cheapest("H100", 8, False, three)}
    assert found["h100"] == ("lambda", "us-west-1", "gpu_1x_h100_pcie", 2.29)
    assert data["skypilot"]["read"] == ["runpod", "lambda", "aws"]
    warnings = " | ".join(data["warnings"])
    assert "SkyPilot (runpod): Failed to fetch RunPod catalog runpod/vms.csv. Using cached catalog files." in warnings
    assert f"SkyPilot could not read vast's price table ({root / 'vast' / 'vms.csv'}): ProxyError" in warnings
    assert all(c["source"].endswith(", on-demand") for c in data["chosen"])

    assert spot["code"] == 0, spot["err"]
    found = {o["name"]: (o["cloud"], o["region"], o["instance_type"], o["price_per_hour"])
             for o in json.loads(spot["out"])["skypilot"]["offerings"]}
    assert found == {"h100": _cheapest("H100", 1, True, three), "l4": _cheapest("L4", 1, True, three)}
    assert found == {"h100": ("runpod", "CA", "1x_H100_SECURE", 1.99), "l4": ("aws", "eu-west-1", "g6.xlarge", 0.24)}

    assert spot_us["code"] == 0, spot_us["err"]  # eu-west-1 and CA filtered out; aws's cheapest us-east-1 zone
    assert "l4               $0.265  /h  aws us-east-1 g6.xlarge" in spot_us["out"]
    assert "h100             $2.15   /h  runpod US 1x_H100_SECURE" in spot_us["out"]

    assert offline["code"] == 2 and offline["out"] == ""
    assert (f"echo2: error: SkyPilot could not reach its catalog: no price table for vast, fluidstack (SkyPilot caches "
            f"them under {root} and downloads them when missing): vast, fluidstack: ProxyError") in offline["err"]
    assert "pass a catalog file instead: --catalog FILE.toml" in offline["err"]
