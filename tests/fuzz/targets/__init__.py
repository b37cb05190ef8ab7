"""Fuzz targets, one module per surface; importing the package registers them all in :data:`TARGETS`.

* :mod:`.codec`: framing, headers, messages, scan, splice, records
* :mod:`.session`: a whole sans-IO session
* :mod:`.client_auth`: a session in terminate mode, answering the client's SASL itself (client_auth)
* :mod:`.sasl`: terminate mode's PLAIN and SCRAM servers (sasl_server) and its credentials file (credentials_file)
* :mod:`.rules`: the rules loader on YAML text (rules_yaml) and the admin API's JSON bodies (rules_json)
* :mod:`.admin`: raw bytes into the admin HTTP server (admin_http)
* :mod:`.capture`: the capture record builder behind a real session (capture_records)
* :mod:`.editors`: the rules' record editors on Produce and Fetch frames (record_editors)
* :mod:`.lag`: consumer lag's tracker behind a real session, on a moving clock (consumer_lag)
"""

from tests.fuzz.targets import admin, capture, client_auth, codec, editors, lag, rules, sasl, session  # noqa: F401  (registers)
from tests.fuzz.targets.registry import TARGETS, Target, target

__all__ = ["TARGETS", "Target", "target"]
