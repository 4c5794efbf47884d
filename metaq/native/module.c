/*
 * metaq.native._bytes: its method table and init; each function is in the file of its concern
 * (metaq/native/__init__.py maps them).
 *
 * Functions, each the exact twin of a pure-Python reference that is used
 * when this module was not built (hypothesis tests in tests/protocol,
 * tests/store and tests/client hold them equal), and a thread for the flusher:
 *
 *   scan_put_ats(...)                              == metaq.timers.burst.scan_put_ats_py (timerburst.c)
 *   encode_timer_acks(items, start, count, first_id) == metaq.timers.burst.encode_timer_acks_py (same)
 *   scan_puts(buf, pos, end, max_body, max_line[, max_frames])
 *                                                 == metaq.protocol.burst.scan_puts_py (textburst.c)
 *   scan_idem_burst(buf, pos, end, max_body, max_line[, max_frames[, owner]])
 *                                                 == metaq.idempotence.burst.scan_idem_burst_py (idemburst.c)
 *   encode_put_acks(frames, start, count, first_id, partition, first_offset)
 *                                                 == metaq.protocol.burst.encode_put_acks_py (textburst.c)
 *   write_run(log, seg_start, rel, ready, src, frames, i, j, topic, partition,
 *             offset, now_ms, first_id, index, unit_at) == metaq.store.batch.write_run_py (records.c)
 *   gather_records(units, skip, log, seg_start, seg_end, limit, nbytes, verify=False, topic=None, partition=0,
 *                  first=0)
 *                                                 == metaq.store.gather.gather_records_py (records.c)
 *   check_ranges(units, skip, log, seg_start, seg_end, limit, nbytes, topic=None, partition=0, first=0)
 *                                                 == metaq.store.gather.check_ranges_py (records.c)
 *   send_ranges(fd, head, log, ranges, pos)       == metaq.server.zerocopy.send_ranges_py (send.c)
 *   send_each(packets, fds)                       == metaq.mqtt.fanout.send_each_py (send.c)
 *   encode_sub_records(topic, partition, payloads, seq0)
 *                                                 == metaq.protocol.putbatch.encode_sub_records_py (client.c)
 *   encode_idem_sub_records(topic, partition, payloads, pid, seq0)
 *                                                 == metaq.idempotence.wire.encode_idem_sub_records_py (client.c)
 *   scan_reply(buf, verify=True)                   == metaq.protocol.message.scan_reply_py (client.c)
 *   gather_payloads(buf, index, count, base=0)     == metaq.protocol.message.gather_payloads_py (client.c)
 *   scan_records(buf, pos, end)                   == metaq.store.record.scan_records_py (records.c)
 *   record_ok(buf, pos, size)                     == metaq.store.record.record_ok_py (records.c)
 *   scan_log(buf, rel, size, base, max_records)   == metaq.store.recovery_scan.scan_log_py (recovery.c)
 *   write_units(dst, at, src, src_at, n)          == metaq.store.recovery_scan.write_units_py (recovery.c)
 *   nonzero_end(buf, start, end)                  == metaq.store.mapped.nonzero_end_py (recovery.c)
 *   keyed_records(buf, rel, stop, end)            == metaq.keys.index.keyed_records_py (recovery.c)
 *   mqtt_plain_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
 *                                                 == metaq.mqtt.wire.plain_publishes_py (mqttpublishes.c)
 *   mqtt_burst_frames(staged, largest)            == metaq.mqtt.port.burst_frames_py (mqttpublishes.c)
 *   mqtt_read_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
 *                                                 == metaq.mqtt.wire.read_publishes_py (mqttturn.c)
 *   mqtt_plain_pubacks(buf, pos, v5, max_packet)  == metaq.mqtt.wire.plain_pubacks_py (mqttacks.c)
 *   mqtt_split, mqtt_publish_bytes, mqtt_pubacks  == metaq.mqtt.wire's split_py, publish_bytes_py and
 *                                                 encode_pubacks_py (mqttwire.c)
 *   now_ms()                                     == metaq.server.clock.now_ms_py (clock.c)
 *   ws_frames(buf, pos, max_frame)               == metaq.protocol.wsframe.frames_py (wsframe.c)
 *
 *   crc32(data, value=0)                         == zlib.crc32 (metaq.protocol.checksum uses it; records.c)
 *   SyncWorker(notify_fd)                        fdatasync off the GIL (metaq/server/flusher.py;
 *                                                in sync.c)
 *
 * See those docstrings for what they do. CRC-32 (IEEE, reflected, as zlib and
 * Java compute it) comes from Intel's ISA-L when setup.py found it
 * (crc32_gzip_refl: carry-less multiply folding, about 4x zlib's speed here)
 * and from zlib otherwise; CRC32_IMPL says which. Each body's CRC is computed
 * once; the record CRC is the header's CRC combined with it (zlib's
 * crc32_combine_op, with the operator for each body length kept across calls).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "native.h"

static PyMethodDef methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, value=0) -> the unsigned CRC-32 of data (as zlib.crc32)"},
    {"scan_puts", scan_puts, METH_VARARGS,
     "scan_puts(buf, pos, end, max_body, max_line, max_frames=no limit) -> (frames, next_pos)"},
    {"scan_idem_burst", scan_idem_burst, METH_VARARGS,
     "scan_idem_burst(buf, pos, end, max_body, max_line, max_frames=no limit, owner=None) -> (frames, data, next_pos)"},
    {"scan_put_ats", scan_put_ats, METH_VARARGS,
     "scan_put_ats(buf, pos, end, max_body, max_frames, now_ms, timer_topic, entry_type, max_name, max_ahead_ms)"
     " -> (items, src, next_pos)"},
    {"encode_timer_acks", encode_timer_acks, METH_VARARGS,
     "encode_timer_acks(items, start, count, first_id) -> the result 200 replies of taken put_ats, joined"},
    {"now_ms", now_ms, METH_NOARGS, "now_ms() -> milliseconds since the Unix epoch: metaq.server.clock.now_ms_py"},
    {"write_run", (PyCFunction)(void (*)(void))write_run, METH_FASTCALL,
     "write_run(log, seg_start, rel, ready, src, frames, i, j, topic, partition, offset, now_ms, first_id, index, "
     "unit_at) -> (count, rel_after)"},
    {"encode_sub_records", encode_sub_records, METH_VARARGS,
     "encode_sub_records(topic, partition, payloads, seq0) -> a putb body: one sub-record per payload"},
    {"encode_idem_sub_records", encode_idem_sub_records, METH_VARARGS,
     "encode_idem_sub_records(topic, partition, payloads, pid, seq0) -> a putb_idem body: a put_idem frame each"},
    {"scan_reply", scan_reply, METH_VARARGS,
     "scan_reply(buf, verify=True) -> (index, count, stop, fault): a get reply's records, six int64s each"},
    {"gather_payloads", gather_payloads, METH_VARARGS,
     "gather_payloads(buf, index, count, base=0) -> (offsets, data): an Arrow binary column's int32 offsets and data"},
    {"encode_put_acks", encode_put_acks, METH_VARARGS,
     "encode_put_acks(frames, start, count, first_id, partition, first_offset) -> the result 200 replies, joined"},
    {"record_ok", py_record_ok, METH_VARARGS,
     "record_ok(buf, pos, size) -> True when a valid record of exactly size bytes starts at pos"},
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(buf, pos, end) -> (where the run of valid records from pos stops, how many records it holds)"},
    {"gather_records", gather_records, METH_VARARGS,
     "gather_records(units, skip, log, seg_start, seg_end, limit, nbytes, verify=False, topic=None, partition=0, "
     "first=0) -> (count, data, stop)"},
    {"check_ranges", check_ranges, METH_VARARGS,
     "check_ranges(units, skip, log, seg_start, seg_end, limit, nbytes, topic=None, partition=0, first=0) -> "
     "(count, ranges, their bytes, stop)"},
    {"send_ranges", send_ranges, METH_VARARGS,
     "send_ranges(fd, head, log, ranges, pos) -> bytes sent by one non-blocking sendmsg"},
    {"send_each", (PyCFunction)(void (*)(void))send_each, METH_FASTCALL,
     "send_each(packets, fds) -> [(i, bytes taken or -errno)] of the fds that did not take all of the packets"},
    {"scan_log", scan_log, METH_VARARGS,
     "scan_log(buf, rel, size, base, max_records) -> (stop, count, max_msg_id, units, runs): recovery's scan"},
    {"write_units", write_units, METH_VARARGS,
     "write_units(dst, at, src, src_at, n) -> how many of the n index units at dst[at:] differed (rewritten)"},
    {"nonzero_end", nonzero_end, METH_VARARGS,
     "nonzero_end(buf, start, end) -> one past the last non-zero byte of buf[start:end], or start if none"},
    {"keyed_records", keyed_records, METH_VARARGS,
     "keyed_records(buf, rel, stop, end) -> (where the walk stopped, [rel of each record with attributes])"},
    {"mqtt_plain_publishes", (PyCFunction)(void (*)(void))mqtt_plain_publishes, METH_FASTCALL,
     "mqtt_plain_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes) -> (entries, pos, "
     "qos1, nbytes)"},
    {"mqtt_read_publishes", (PyCFunction)(void (*)(void))mqtt_read_publishes, METH_FASTCALL,
     "mqtt_read_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes) -> (entries, pos, "
     "qos1, nbytes, pubacks): mqtt_plain_publishes and the PUBACKs of the QoS 1 ones (mqttturn.c)"},
    {"mqtt_plain_pubacks", mqtt_plain_pubacks, METH_VARARGS,
     "mqtt_plain_pubacks(buf, pos, v5, max_packet) -> ([packet ids], next pos): a read's plain PUBACKs (mqttacks.c)"},
    {"mqtt_split", (PyCFunction)(void (*)(void))mqtt_split, METH_FASTCALL,
     "mqtt_split(buf, pos, max_packet, version, names) -> (fields, a, b): the next MQTT packet's bounds, a plain "
     "PUBLISH's or PUBACK's fields decoded (mqttwire.c)"},
    {"mqtt_publish_bytes", (PyCFunction)(void (*)(void))mqtt_publish_bytes, METH_FASTCALL,
     "mqtt_publish_bytes(first, topic, packet_id, props, payload) -> an encoded PUBLISH (mqttwire.c)"},
    {"mqtt_pubacks", mqtt_pubacks, METH_O, "mqtt_pubacks(packet_ids) -> the successful PUBACKs, joined (mqttwire.c)"},
    {"mqtt_burst_frames", (PyCFunction)(void (*)(void))mqtt_burst_frames, METH_FASTCALL,
     "mqtt_burst_frames(staged, largest) -> (frames, src, general, names): the store's burst frames of staged puts"},
    {"encode_fields", encode_fields, METH_VARARGS,
     "encode_fields(fields) -> protobuf bytes of (field number, value, ...) pairs (rmq5.messagebytes)"},
    {"pop_handle", (PyCFunction)(void (*)(void))pop_handle, METH_FASTCALL,
     "pop_handle(partition, offset, attempt, deadline_ms) -> a receipt handle's text (pop.c)"},
    {"pop_parse_handles", pop_parse_handles, METH_O,
     "pop_parse_handles(handles) -> (partition, offset, attempt, deadline_ms) or None a handle (pop.c)"},
#ifdef METAQ_HAVE_OPENSSL
    {"served_record", (PyCFunction)(void (*)(void))served_record, METH_FASTCALL,
     "served_record(data, flag, topic, queue_id, queue_offset, born_ms, store_ms, msg_id, endpoint, served, context) "
     "-> a served message's response bytes, None, or its unknown born host's text (servedmsg.c; rmq5.messagebytes)"},
#endif
    {"ws_frames", ws_frames, METH_VARARGS,
     "ws_frames(buf, pos, max_frame) -> (payloads, pos, head, length): a WebSocket client's common frames unmasked "
     "(wsframe.c)"},
    {"grpc_frames", grpc_frames, METH_O,
     "grpc_frames(items) -> the gRPC messages items, each length-prefixed, joined (protobuf.c; rmq5.wire)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "metaq.native._bytes",
                                    "The put-burst fast path in C (optional; see metaq.protocol.burst).", -1, methods};

PyMODINIT_FUNC PyInit__bytes(void) {
    if (PyType_Ready(&SyncWorkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SyncWorkerType);
    if (PyModule_AddStringConstant(m, "CRC32_IMPL", CRC32_IMPL_NAME) < 0 ||
        PyModule_AddObject(m, "SyncWorker", (PyObject *)&SyncWorkerType) < 0) {
        Py_DECREF(&SyncWorkerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
