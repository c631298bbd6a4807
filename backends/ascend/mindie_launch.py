"""Start ``mindieservice_daemon`` on a port chosen by shuniu (a ``launch:`` command helper).

MindIE Service takes no address or port on its command line: it reads them from its
``config.json`` (``ServerConfig.ipAddress``, ``port``, ``managementIpAddress``,
``managementPort``, ``metricsPort``), found through ``MIES_CONFIG_JSON_PATH`` or else
``$MINDIE_LLM_HOME_PATH/conf/config.json``. So a ``launch:`` entry cannot pass ``{port}``
to it directly. This helper does it: it copies a base ``config.json`` with the address and
port set (every plane on that one port, so one ``base_url`` reaches the API, the health
probes and ``/metrics``), writes it owner-readable only, points ``MIES_CONFIG_JSON_PATH`` at
it and replaces itself with the daemon (``exec``: same process id, so the gateway's
signals reach the daemon)::

    launch:
      command: [python, -m, shuniu.backends.ascend.mindie_launch,
                --config, /usr/local/Ascend/mindie/latest/mindie-service/conf/config.json,
                --host, "{host}", --port, "{port}", "--",
                /usr/local/Ascend/mindie/latest/mindie-service/bin/mindieservice_daemon]
      env: {ASCEND_RT_VISIBLE_DEVICES: "0,1", MIES_SERVICE_MONITOR_MODE: "1"}

Everything else (``npuDeviceIds``, ``worldSize``, the model, HTTPS) stays as the base file
says; ``--http`` turns HTTPS off for an engine that only listens on the loopback address.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["main", "render_config"]

DEFAULT_DAEMON = "mindieservice_daemon"


def render_config(
    base: dict[str, Any],
    *,
    host: str,
    port: int,
    http: bool = False,
    model_name: str | None = None,
) -> dict[str, Any]:
    """``base`` (a MindIE ``config.json``) with every plane on ``host:port``."""
    config = json.loads(json.dumps(base))  # a deep copy that stays plain JSON
    server = config.setdefault("ServerConfig", {})
    server["ipAddress"] = host
    server["managementIpAddress"] = host
    # One port for the business, management and metrics planes: MindIE then runs a single
    # HTTP server with every route, so the backend needs no management_url or metrics_url.
    server["port"] = server["managementPort"] = server["metricsPort"] = port
    if host in ("0.0.0.0", "::"):
        server["allowAllZeroIpListening"] = True
    if http:
        server["httpsEnabled"] = False
    if model_name is not None:
        models = config.get("BackendConfig", {}).get("ModelDeployConfig", {}).get("ModelConfig", [])
        if not models:
            raise ValueError("the base config has no BackendConfig.ModelDeployConfig.ModelConfig to name")
        models[0]["modelName"] = model_name
    return config


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        at = argv.index("--")
        ours, daemon = argv[:at], argv[at + 1 :]
    else:
        ours, daemon = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m shuniu.backends.ascend.mindie_launch",
        description="Write a MindIE config.json for one port and exec mindieservice_daemon with it.",
    )
    parser.add_argument("--config", required=True, type=Path, help="the base config.json")
    parser.add_argument("--port", required=True, type=int, help="port of every plane (shuniu's {port})")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (shuniu's {host})")
    parser.add_argument("--http", action="store_true", help="set httpsEnabled to false")
    parser.add_argument("--model-name", help="set the first ModelConfig's modelName (shuniu's {model})")
    parser.add_argument("--out", type=Path, help="where to write the config (default: a private temp file)")
    return parser.parse_args(ours), daemon or [DEFAULT_DAEMON]


def main(argv: list[str] | None = None) -> None:
    args, daemon = _parse(sys.argv[1:] if argv is None else argv)
    if not 1 <= args.port <= 65535:
        raise SystemExit(f"--port {args.port} is not a port")
    base = json.loads(args.config.read_text("utf-8"))
    config = render_config(base, host=args.host, port=args.port, http=args.http, model_name=args.model_name)
    if args.out is not None:
        out = args.out
        out.parent.mkdir(parents=True, exist_ok=True)
    else:
        fd, name = tempfile.mkstemp(prefix=f"mindie-{args.port}-", suffix=".json")
        os.close(fd)
        out = Path(name)
    out.write_text(json.dumps(config, indent=4), "utf-8")
    # MindIE refuses a config file others may write (its security checks want 640 or less).
    out.chmod(0o640)
    os.environ["MIES_CONFIG_JSON_PATH"] = str(out.absolute())
    sys.stdout.flush()
    os.execvp(daemon[0], daemon)


if __name__ == "__main__":
    main()
