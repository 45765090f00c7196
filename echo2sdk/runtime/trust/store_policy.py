"""What a rollout worker opens because a coordinator's welcome names a snapshot store.

A welcome names the run's store (`StoreInfo`: a URL and options) and the worker hands them to the storage library
(obstore), which reads local files, sends this machine's credentials and asks the cloud's instance-metadata service
wherever its options point. So the worker takes, without its operator's word:

- a URL whose scheme is one of STORE_SCHEMES (s3, gs, az; the learner's config takes the same, and a plain path);
  a `file://` store - a folder on this machine, which the worker would list and read - only with
  `--allow-plugin store.local` (the learner gives it to the local workers it starts);
- options named in SAFE_STORE_OPTIONS, the learner's config's own allow-list (where and how to connect, never a
  secret); any other name (one naming a credentials file, a credential or metadata endpoint ...) only with
  `--allow-plugin store.NAME`, or `store.NAME=VALUE` for that value alone;
- of those, the ones that decide where requests and so the credentials signing them go (STEERING: the endpoint,
  plain http, an emulator) only as this machine's environment sets them (AWS_ENDPOINT, AWS_ALLOW_HTTP) or with
  `--allow-plugin store.NAME[=VALUE]`, when the worker signs at all. A worker that does not sign sends nothing
  secret, so where its requests go is no risk: every byte it reads is verified against the run's signed manifests.

Credentials come from this machine's environment only (`signs`: AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS,
...; the options can hold none). Without them the store is read unsigned: the storage library would otherwise ask
the instance-metadata service (169.254.169.254) for an instance role's credentials, which a worker does only when
its operator says so (`--allow-plugin store.metadata`; a learner: `broadcast.store_metadata = true`).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

from echo2sdk.config import SAFE_STORE_OPTIONS, STORE_SCHEMES, store_option_problem
from echo2sdk.errors import ConfigError
from echo2sdk.runtime.protocol.messages import StoreInfo, shown

__all__ = ["store_settings", "store_allowances", "signs", "LOCAL", "METADATA", "STEERING"]

LOCAL = "store.local"  # a file:// store: a folder on the worker's machine
METADATA = "store.metadata"  # let the storage library ask the instance-metadata service for credentials
#: Options that decide where requests, and the credentials that sign them, go.
STEERING = frozenset({"endpoint", "aws_endpoint", "allow_http", "use_emulator", "azure_storage_use_emulator",
                      "use_fabric_endpoint"})
#: The environment variables that set a steering option on this machine (the storage library reads them too).
_STEERING_ENV = {"endpoint": ("AWS_ENDPOINT", "AWS_ENDPOINT_URL"), "aws_endpoint": ("AWS_ENDPOINT", "AWS_ENDPOINT_URL"),
                 "allow_http": ("AWS_ALLOW_HTTP",)}
#: The environment variables through which a machine's operator gives the storage library credentials, by scheme.
CREDENTIAL_ENV = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
           "AWS_CONTAINER_CREDENTIALS_FULL_URI"),
    "gs": ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY",
           "GOOGLE_APPLICATION_CREDENTIALS"),
    "az": ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_MASTER_KEY", "AZURE_STORAGE_SAS_KEY",
           "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_TOKEN", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE",
           "AZURE_USE_AZURE_CLI"),
}
_GCLOUD_DEFAULT = Path(".config/gcloud/application_default_credentials.json")  # under $HOME: gcloud's login

Need = tuple[str | None, str]  # (the allowance that admits it, or None when nothing does; the reason)


def scheme_of(url: str) -> str:
    return url.partition("://")[0] if "://" in url else ""


def signs(scheme: str, metadata: bool, env: Mapping[str, str] = os.environ, options: Collection[str] = ()) -> bool:
    """Whether requests to a `scheme` store are signed: this machine's environment holds credentials for it, its
    operator lets the storage library ask the instance-metadata service (`metadata`), or `options` (names) go beyond
    the connection ones (the operator's own credential settings: a learner's API caller, an allowed worker). A
    local folder signs nothing."""
    if scheme not in CREDENTIAL_ENV:
        return False
    if metadata or any(env.get(name) for name in CREDENTIAL_ENV[scheme]) or set(options) - SAFE_STORE_OPTIONS:
        return True
    return scheme == "gs" and bool(env.get("HOME")) and (Path(env["HOME"]) / _GCLOUD_DEFAULT).is_file()


def store_settings(info: StoreInfo, allowed: Collection[str] = (),
                   env: Mapping[str, str] = os.environ) -> tuple[str, dict[str, str], bool]:
    """(url, options, metadata) a worker opens the welcome's store with: ConfigError naming the first setting its
    operator did not allow."""
    allowed = frozenset(allowed)
    metadata = METADATA in allowed
    for allowance, why in _needs(info, metadata, env):
        if allowance is None:
            raise ConfigError(why)
        if allowance not in allowed and allowance.partition("=")[0] not in allowed:
            raise ConfigError(f"{why}; this worker takes it only when started with  --allow-plugin {allowance}")
    return info.url, dict(info.options), metadata


def store_allowances(info: StoreInfo | None, metadata: bool = False, env: Mapping[str, str] = os.environ) -> list[str]:
    """The `--allow-plugin` values a worker on this machine needs for the store `info` (None: no store): what the
    learner's operator configured, for the workers the learner starts itself. Exact values (store.NAME=VALUE)."""
    if info is None:
        return []
    needs = {allowance for allowance, _ in _needs(info, metadata, env) if allowance is not None}
    return sorted(needs | ({METADATA} if metadata else set()))


def _link_local(value: str) -> bool:
    """Whether an endpoint names a link-local address (169.254.0.0/16, fe80::/10: the cloud's metadata service lives
    there) or a metadata host name."""
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(value).hostname or "") if "://" in value else ""
    if host.rstrip(".").lower() in ("metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"):
        return True
    try:
        return ipaddress.ip_address(host).is_link_local
    except ValueError:
        return False


def _needs(info: StoreInfo, metadata: bool, env: Mapping[str, str]) -> Iterator[Need]:
    """What of the store `info` needs the operator's word on a machine of environment `env` (signing its requests
    when it has credentials there, or `metadata`)."""
    url, options, scheme = info.url, info.options, scheme_of(info.url)
    signed = signs(scheme, metadata, env, options)
    if scheme not in STORE_SCHEMES:
        yield None, (f"the coordinator's store {shown(url)}: scheme {shown(scheme)} is not one a worker reads "
                     f"({', '.join(sorted(STORE_SCHEMES))})")
    elif scheme == "file":
        yield LOCAL, f"the coordinator's store {shown(url)} is a folder on this machine"
    for name, value in sorted(options.items()):  # what no coordinator may set on its own, first
        if problem := store_option_problem(name, value):
            yield f"store.{name}={value}", f"the coordinator's store option {name} = {shown(value)} is {problem}"
        elif name in STEERING and _link_local(value):
            yield f"store.{name}={value}", (f"the coordinator's store option {name} = {shown(value)} names a "
                                            "link-local or metadata address")
    for name, value in sorted(options.items(), key=lambda kv: ("endpoint" not in kv[0], kv[0])):
        if name in STEERING and signed and not any(env.get(var) == value for var in _STEERING_ENV.get(name, ())):
            yield f"store.{name}={value}", (
                f"the coordinator's store option {name} = {shown(value)} decides where this worker's credentials go")
