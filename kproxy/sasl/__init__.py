"""SASL, all of it: the mechanisms, the credentials, the Kafka side of each login kproxy takes part
in, and the two units a session owns for it (sans-IO: bytes in, bytes and decisions out, no sockets).

Mechanisms and what they check, on the standard library alone:

* :mod:`~kproxy.sasl.scram`: SCRAM's arithmetic (RFC 5802 with the SHA-256 and SHA-512 hashes Kafka
  names in KIP-84), shared by both sides kproxy can take;
* :mod:`~kproxy.sasl.client`: the client side of PLAIN, SCRAM and OAUTHBEARER (kproxy logging in to
  brokers, ``sasl.upstream``); :mod:`~kproxy.sasl.secret_file`: its secret, re-read when its file
  changes;
* :mod:`~kproxy.sasl.server`: the server side of PLAIN and SCRAM (terminate mode,
  ``sasl.client.mode: terminate``); :mod:`~kproxy.sasl.credentials`: the users it checks against,
  :mod:`~kproxy.sasl.credentials_file` the file that holds them; :mod:`~kproxy.sasl.unknown_users`:
  the made-up entries of users the file does not hold; :mod:`~kproxy.sasl.password_queue`: which
  slow PLAIN hash runs next, and which not at all.

The Kafka side, reading requests through :class:`~kproxy.sasl.requests.SaslRequest`:

* :mod:`~kproxy.sasl.authenticator`: kproxy's SASL server as a broker answers SaslHandshake,
  SaslAuthenticate and raw tokens, state by state;
* :mod:`~kproxy.sasl.relay`: a client's own exchange relayed to the broker, read for who logs in;
* :mod:`~kproxy.sasl.upstream_login`: kproxy's own login on an upstream connection.

The session's units (kproxy/proxy/session.py owns and calls them, each keeping its own state):
:mod:`~kproxy.sasl.login_gate` holds the client while kproxy logs in to the broker;
:mod:`~kproxy.sasl.client_login` is terminate mode's client login (the verification to run, the
upstream connection it earns, the requests that wait for it).

Below the session, the server and the config (pyproject.toml's import contracts): they use SASL,
it uses none of them. What needs the event loop stays in the server: the worker threads that run
the hashes (kproxy/server/password_checks.py), the credentials file's reloads
(kproxy/server/client_auth.py), kproxy's login over a bare stream (kproxy/server/upstream_auth.py).
"""
