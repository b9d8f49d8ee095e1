import sys
import urllib.request

print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=1).read().decode(), end="")
