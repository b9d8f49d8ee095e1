"""TCP -> unix socket relay run *inside* a sandbox by a harness that speaks only TCP (Codex).

`python3 forward.py PORT SOCKET PORTFILE`: listen on 127.0.0.1:PORT (0: any free port) of the
sandbox's own network namespace, relay each connection to the unix SOCKET (the gateway session's,
bound in read-only), and write the port to PORTFILE once listening. Standard library only: it runs
under whatever python the sandbox has, and dies with the sandbox (its PID namespace).
"""

import asyncio
import os
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main(port: int, sock: str, portfile: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(sock)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    tmp = f"{portfile}.tmp"
    with open(tmp, "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    os.replace(tmp, portfile)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
