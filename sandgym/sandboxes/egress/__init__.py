"""Egress: allow-listed outbound network for sandboxes that otherwise have none.

rules.py (entries: parse, validate, match; stdlib only), acl_helper.py (squid's external
ACL helper, stdlib only), proxy.py (one squid per provider, policy files, the egress log),
forwarder.py (host side: each sandbox's unix socket -> squid from that sandbox's own
loopback source address). The in-sandbox end is execd's relay (execd/egress_relay.py).
"""
