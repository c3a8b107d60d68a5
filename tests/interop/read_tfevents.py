#!/usr/bin/python3
"""Reads TensorBoard event files without TensorBoard, TensorFlow or protobuf.

    read_tfevents.py FILE...

prints one JSON line per scalar or text value, in file order:

    {"step": 3, "wall_time": 1700000000.5, "tag": "loss", "value": 0.25}
    {"step": 3, "wall_time": 1700000000.5, "tag": "notes", "text": "..."}

A value that is NaN or infinite is printed as the string "NaN", "Infinity"
or "-Infinity", so that every line is strict JSON.

Every record's two masked CRC-32Cs are checked, and the protobuf wire format
is decoded field by field; the first event must carry file_version
"brain.Event:2". A CRC mismatch, a truncated record or a malformed field ends
the program with exit code 1 and one line on stderr that names the file and
the byte offset. Nothing of a file is printed unless all of it is read.

As a module: read_events(path) returns the same values as a list of dicts
(floats as Python floats, NaN included) and raises TFEventsError.

The layout, written independently of the C++ writer it tests
(framework/interop/tensorboard_events.hpp):
- TFRecord: uint64 little-endian payload length, uint32 masked CRC-32C of
  those 8 bytes, the payload, uint32 masked CRC-32C of the payload; masked is
  ((crc >> 15) | (crc << 17)) + 0xa282ead8 modulo 2**32.
- Event: wall_time 1 (double), step 2 (int64), file_version 3 (string),
  summary 5. Summary: value 1 (repeated). Summary.Value: tag 1,
  simple_value 2 (float), tensor 8, metadata 9. SummaryMetadata:
  plugin_data 1 {plugin_name 1}. TensorProto: dtype 1, tensor_shape 2,
  string_val 8 (repeated bytes); DT_STRING is 7.
"""

import json
import math
import struct
import sys

# ---- CRC-32C (Castagnoli), table-driven, reflected ----

_POLY = 0x82F63B78


def _make_table():
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# ---- errors ----


class TFEventsError(Exception):
    """A file that is not a valid event file; names the file and the offset."""

    def __init__(self, path, offset, message):
        super().__init__("%s: byte %d: %s" % (path, offset, message))
        self.path = path
        self.offset = offset
        self.message = message


class _Malformed(Exception):
    def __init__(self, offset, message):
        super().__init__(message)
        self.offset = offset
        self.message = message


# ---- protobuf wire format ----

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


def _varint(buf, pos, end, base):
    """The varint at buf[pos:end] and the position after it."""
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _Malformed(base + start, "varint runs past the end of its message")
        if pos - start >= 10:
            raise _Malformed(base + start, "varint longer than 10 bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    if result >= 1 << 64:
        raise _Malformed(base + start, "varint above 2**64 - 1")
    return result, pos


def fields(buf, start, end, base):
    """Yields (field number, wire type, value, offset in the file) of the
    message in buf[start:end]; base is buf's offset in the file. A varint is
    an unsigned int, fixed64/fixed32 their raw bytes, a length-delimited field
    a (start, end) pair into buf."""
    pos = start
    while pos < end:
        at = base + pos
        key, pos = _varint(buf, pos, end, base)
        number, wire = key >> 3, key & 7
        if number == 0 or number > (1 << 29) - 1:
            raise _Malformed(at, "field number %d out of range" % number)
        if wire == VARINT:
            value, pos = _varint(buf, pos, end, base)
        elif wire == FIXED64:
            if end - pos < 8:
                raise _Malformed(at, "field %d: fixed64 runs past the end of its message" % number)
            value, pos = bytes(buf[pos:pos + 8]), pos + 8
        elif wire == FIXED32:
            if end - pos < 4:
                raise _Malformed(at, "field %d: fixed32 runs past the end of its message" % number)
            value, pos = bytes(buf[pos:pos + 4]), pos + 4
        elif wire == LENGTH_DELIMITED:
            length, pos = _varint(buf, pos, end, base)
            if length > end - pos:
                raise _Malformed(at, "field %d: length %d runs past the end of its message" % (number, length))
            value, pos = (pos, pos + length), pos + length
        else:
            raise _Malformed(at, "field %d: unsupported wire type %d" % (number, wire))
        yield number, wire, value, at


def _expect(number, wire, want, at, message):
    if wire != want:
        raise _Malformed(at, "%s field %d: wire type %d, expected %d" % (message, number, wire, want))


def _utf8(buf, span, at, what):
    try:
        return bytes(buf[span[0]:span[1]]).decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed(at, "%s is not valid UTF-8" % what) from None


def _int64(u):
    return u - (1 << 64) if u >= 1 << 63 else u


def _plugin_name(buf, span, base):
    name = ""
    for number, wire, value, at in fields(buf, span[0], span[1], base):
        if number == 1:  # SummaryMetadata.plugin_data
            _expect(number, wire, LENGTH_DELIMITED, at, "SummaryMetadata")
            for n2, w2, v2, at2 in fields(buf, value[0], value[1], base):
                if n2 == 1:  # PluginData.plugin_name
                    _expect(n2, w2, LENGTH_DELIMITED, at2, "PluginData")
                    name = _utf8(buf, v2, at2, "plugin_name")
    return name


def _tensor(buf, span, base):
    """(dtype, number of dims or None, [string_val bytes...])."""
    dtype, dims, strings = 0, None, []
    for number, wire, value, at in fields(buf, span[0], span[1], base):
        if number == 1:  # dtype
            _expect(number, wire, VARINT, at, "TensorProto")
            dtype = value
        elif number == 2:  # tensor_shape
            _expect(number, wire, LENGTH_DELIMITED, at, "TensorProto")
            dims = 0
            for n2, w2, _v2, at2 in fields(buf, value[0], value[1], base):
                if n2 == 2:  # TensorShapeProto.dim
                    _expect(n2, w2, LENGTH_DELIMITED, at2, "TensorShapeProto")
                    dims += 1
        elif number == 8:  # string_val
            _expect(number, wire, LENGTH_DELIMITED, at, "TensorProto")
            strings.append(bytes(buf[value[0]:value[1]]))
    return dtype, dims, strings


def _summary(buf, span, base):
    """The scalar and text values of a Summary: dicts with tag and value or text."""
    out = []
    for number, wire, value, at in fields(buf, span[0], span[1], base):
        if number != 1:  # Summary.value
            continue
        _expect(number, wire, LENGTH_DELIMITED, at, "Summary")
        tag, simple, plugin, tensor = None, None, "", None
        for n2, w2, v2, at2 in fields(buf, value[0], value[1], base):
            if n2 == 1:
                _expect(n2, w2, LENGTH_DELIMITED, at2, "Summary.Value")
                tag = _utf8(buf, v2, at2, "tag")
            elif n2 == 2:
                _expect(n2, w2, FIXED32, at2, "Summary.Value")
                simple = struct.unpack("<f", v2)[0]
            elif n2 == 8:
                _expect(n2, w2, LENGTH_DELIMITED, at2, "Summary.Value")
                tensor = _tensor(buf, v2, base)
            elif n2 == 9:
                _expect(n2, w2, LENGTH_DELIMITED, at2, "Summary.Value")
                plugin = _plugin_name(buf, v2, base)
        if tag is None:
            tag = ""
        if simple is not None:
            out.append({"tag": tag, "value": simple})
        elif tensor is not None and plugin == "text":
            dtype, _dims, strings = tensor
            if dtype != 7:
                raise _Malformed(at, "text value %r: dtype %d, expected DT_STRING (7)" % (tag, dtype))
            texts = [s.decode("utf-8", errors="replace") for s in strings]
            out.append({"tag": tag, "text": texts[0] if len(texts) == 1 else texts})
    return out


def _event(buf, base):
    """(wall_time, step, file_version or None, [values]) of an Event."""
    wall_time, step, version, values = 0.0, 0, None, []
    for number, wire, value, at in fields(buf, 0, len(buf), base):
        if number == 1:
            _expect(number, wire, FIXED64, at, "Event")
            wall_time = struct.unpack("<d", value)[0]
        elif number == 2:
            _expect(number, wire, VARINT, at, "Event")
            step = _int64(value)
        elif number == 3:
            _expect(number, wire, LENGTH_DELIMITED, at, "Event")
            version = _utf8(buf, value, at, "file_version")
        elif number == 5:
            _expect(number, wire, LENGTH_DELIMITED, at, "Event")
            values = _summary(buf, value, base)
    return wall_time, step, version, values


# ---- records ----


def records(path, data):
    """Yields (offset of the record, offset of its payload, payload) of each
    record in data, checking both CRCs."""
    pos = 0
    n = len(data)
    while pos < n:
        if n - pos < 12:
            raise TFEventsError(path, pos, "truncated record header (%d of 12 bytes)" % (n - pos))
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (stored,) = struct.unpack("<I", data[pos + 8:pos + 12])
        computed = masked_crc32c(header)
        if stored != computed:
            raise TFEventsError(path, pos, "length CRC mismatch (stored 0x%08x, computed 0x%08x)" % (stored, computed))
        start = pos + 12
        if length > n - start or n - start - length < 4:
            raise TFEventsError(path, pos, "truncated record: %d payload bytes + 4 CRC bytes announced, %d left"
                                % (length, n - start))
        payload = data[start:start + length]
        (stored,) = struct.unpack("<I", data[start + length:start + length + 4])
        computed = masked_crc32c(payload)
        if stored != computed:
            raise TFEventsError(path, start, "data CRC mismatch in the %d-byte record data here (stored 0x%08x, "
                                "computed 0x%08x)" % (length, stored, computed))
        yield pos, start, payload
        pos = start + length + 4


def read_events(path):
    """The scalar and text values of an event file, in order: dicts with
    step, wall_time, tag and value (a float) or text (a str)."""
    with open(path, "rb") as f:
        data = f.read()
    out = []
    first = True
    for offset, start, payload in records(path, data):
        try:
            wall_time, step, version, values = _event(memoryview(payload), start)
        except _Malformed as e:
            raise TFEventsError(path, e.offset, e.message) from None
        if first:
            if version != "brain.Event:2":
                raise TFEventsError(path, offset, "first event has file_version %r, expected 'brain.Event:2'"
                                    % version)
            first = False
        for v in values:
            record = {"step": step, "wall_time": wall_time, "tag": v["tag"]}
            if "value" in v:
                record["value"] = v["value"]
            else:
                record["text"] = v["text"]
            out.append(record)
    if first:
        raise TFEventsError(path, 0, "no events (expected a first event with file_version 'brain.Event:2')")
    return out


def _json_value(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return x


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        sys.stderr.write("usage: read_tfevents.py FILE...\n")
        return 2
    for path in argv[1:]:
        try:
            events = read_events(path)
        except TFEventsError as e:
            sys.stderr.write("read_tfevents.py: %s\n" % e)
            return 1
        except OSError as e:
            sys.stderr.write("read_tfevents.py: %s: %s\n" % (path, e.strerror or e))
            return 1
        for record in events:
            record["wall_time"] = _json_value(record["wall_time"])
            if "value" in record:
                record["value"] = _json_value(record["value"])
            sys.stdout.write(json.dumps(record, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
