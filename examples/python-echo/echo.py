#!/usr/bin/env python3
"""python-echo: the minimal conduit extension, on the Python SDK (extensions/python).

Serves `echo` (params {"text": string}, answered with the params as received) and, like every
SDK extension, `check.sleep`. The SDK (put beside this file as conduit_extension/ when staged)
does the protocol: framing, the handshake, cancellation, the 64-request limit, shutdown.
"""
from conduit_extension import Extension, RpcError

ext = Extension("python-echo", "0.1.0")


@ext.method("echo")
def echo(ctx, params):
    if not isinstance(params.get("text"), str):
        raise RpcError.invalid_params('echo needs params {"text": string}')
    return params


if __name__ == "__main__":
    ext.run()
