"""A tiny HTTP service configured by service.ini (section [server]: enabled, port, body_file)."""

import configparser
import pathlib
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

HERE = pathlib.Path(__file__).parent
cfg = configparser.ConfigParser()
cfg.read(HERE / "service.ini")
server = cfg["server"]
if not server.getboolean("enabled", fallback=False):
    sys.exit("service disabled in service.ini")
body = (HERE / server.get("body_file", "missing.txt")).read_bytes()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", server.getint("port")), Handler).serve_forever()
