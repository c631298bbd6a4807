"""``shuniu usage`` and the admin-API commands of ``shuniu keys``: clients of a running
gateway's ``/v1/usage`` and ``/admin/keys`` (``docs/governance.md``)."""

from __future__ import annotations

from shuniu.plugins.tools.usage.client import GatewayClient, GatewayClientError

__all__ = ["GatewayClient", "GatewayClientError"]
