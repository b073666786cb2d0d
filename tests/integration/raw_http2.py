"""A minimal HTTP/2 client for attacks on the learner's port, written from
RFC 9113 and 7541 (no h2 package needed): it opens a connection (TLS with
ALPN h2, or plaintext), sends gRPC calls whose message it leaves one byte
short, honours flow control and notes the streams the server resets."""
import select
import socket
import ssl
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_int(value, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def literal(name, value):
    """A header field as a literal without indexing, with a new name."""
    name, value = name.encode(), value.encode()
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


class Connection:
    def __init__(self, port, tls, source="127.0.0.1", host="127.0.0.1"):
        raw = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["h2"])
            raw = ctx.wrap_socket(raw, server_hostname="localhost")
        self.sock, self.tls, self.host = raw, tls, host
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self.conn_window = 65535
        self.initial_window = 65535
        self.windows = {}
        self.reset = set()
        self.closed = False
        self.next_stream = 1
        self.buf = b""

    def start_call(self, path, metadata=()):
        sid = self.next_stream
        self.next_stream += 2
        block = b"".join(literal(k, v) for k, v in [
            (":method", "POST"), (":scheme", "https" if self.tls else "http"), (":path", path),
            (":authority", self.host), ("content-type", "application/grpc"), ("te", "trailers")]
            + list(metadata))
        self.sock.sendall(frame(HEADERS, 0x4, sid, block))
        self.windows[sid] = self.initial_window
        return sid

    def pump(self, timeout=0.0):
        """Reads what the server sent: windows, resets, settings (acked)."""
        while not self.closed:
            pending = self.tls and self.sock.pending()
            if not pending and not select.select([self.sock], [], [], timeout)[0]:
                return
            timeout = 0
            try:
                chunk = self.sock.recv(65536)
            except (ssl.SSLWantReadError, BlockingIOError):
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self.buf += chunk
            while len(self.buf) >= 9:
                length = struct.unpack(">I", b"\0" + self.buf[:3])[0]
                if len(self.buf) < 9 + length:
                    break
                kind, flags = self.buf[3], self.buf[4]
                sid = struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF
                payload = self.buf[9:9 + length]
                self.buf = self.buf[9 + length:]
                self.handle(kind, flags, sid, payload)

    def handle(self, kind, flags, sid, payload):
        if kind == SETTINGS and not flags & 1:
            for i in range(0, len(payload), 6):
                ident, value = struct.unpack(">HI", payload[i:i + 6])
                if ident == 4:  # SETTINGS_INITIAL_WINDOW_SIZE
                    for s in self.windows:
                        self.windows[s] += value - self.initial_window
                    self.initial_window = value
            self.sock.sendall(frame(SETTINGS, 1, 0))
        elif kind == WINDOW_UPDATE:
            inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            if sid == 0:
                self.conn_window += inc
            elif sid in self.windows:
                self.windows[sid] += inc
        elif kind == RST_STREAM or (kind == HEADERS and flags & 1):
            self.reset.add(sid)
        elif kind == PING and not flags & 1:
            self.sock.sendall(frame(PING, 1, 0, payload))
        elif kind == GOAWAY:
            self.closed = True

    def send_message_short(self, sid, size, deadline):
        """Sends a gRPC message that declares `size` bytes and carries one
        less, as far as flow control and the server allow before
        `deadline`. Returns the bytes sent."""
        todo = 5 + size - 1
        sent = 0
        head = b"\x00" + struct.pack(">I", size)
        while sent < todo and sid not in self.reset and not self.closed and time.time() < deadline:
            room = min(self.conn_window, self.windows.get(sid, 0), 16384, todo - sent)
            if room <= 0:
                self.pump(0.05)
                continue
            body = (head + bytes(room))[:room] if sent == 0 else bytes(room)
            try:
                self.sock.sendall(frame(DATA, 0, sid, body))
            except OSError:
                self.closed = True
                break
            sent += room
            self.conn_window -= room
            self.windows[sid] -= room
            self.pump(0)
        return sent

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
