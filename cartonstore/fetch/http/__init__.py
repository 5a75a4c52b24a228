"""The HTTP client the fetcher uses: one aiohttp session with
cartonstore's rules (client.py), its settings (config.py), Content-Encoding
decoding (content_encoding.py, codings.py), URL and address policy
(policy.py, addresses.py, resolver.py), proxies (proxies.py), big bodies
read from the socket on their own thread (socket_body.py, sink.py), and
the types of what the layers above hand in (a registry's challenge
answerer, and the source kinds declared beside it). Knows nothing of the
store. Imports errors, zipfmt/ and the layers below.
"""
