"""SASL mechanisms kproxy speaks itself (sans-IO: bytes in, bytes out, no sockets).

:mod:`kproxy.sasl.scram` holds SCRAM's arithmetic (RFC 5802 with the SHA-256 and SHA-512 hashes
Kafka names in KIP-84), shared by both sides kproxy can take: the client side, when kproxy
authenticates to the cluster for its clients, and the server side, when it checks clients' own
credentials. The relay of a client's own exchange is elsewhere (:mod:`kproxy.sasl.relay`): it only
reads who logs in.
"""
