#!/usr/bin/env python3
"""Writes the hand-made seed inputs of the fuzz targets (tests/fuzz/<target>/seed-*).

Run from anywhere; files found by `make fuzz` are added next to these by hand when they
reproduce a bug. The binary formats mirror src/engine/kv_journal.cpp, kv_pool.cpp and
kv_state.cpp; the fingerprint and key are the ones the kv_files target expects.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
M64 = (1 << 64) - 1


def fnv1a64(data, h=0xcbf29ce484222325):
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & M64
    return h


def checksum64(data):
    h = 0xcbf29ce484222325 ^ len(data)
    i = 0
    while i + 8 <= len(data):
        (w,) = struct.unpack_from('<Q', data, i)
        h = ((h ^ w) * 0x100000001b3) & M64
        h ^= h >> 29
        i += 8
    return fnv1a64(data[i:], h)


def state(positions, v_trans=False, n_layer=2, seq=0):
    """A llama.cpp sequence state holding the given positions, one stream."""
    s = struct.pack('<IiI', 0xaf143cd8, seq, 1) + struct.pack('<I', len(positions))
    for p in positions:
        s += struct.pack('<iIi', p, 1, seq)
    s += struct.pack('<II', 1 if v_trans else 0, n_layer)
    for l in range(n_layer):
        s += struct.pack('<iQ', 1, 4) + b''.join(bytes([(l + p + b) & 255 for b in range(4)]) for p in positions)
    for l in range(n_layer):
        if v_trans:
            s += struct.pack('<iII', 1, 2, 3)
            for j in range(3):
                s += b''.join(struct.pack('<H', (l * 7 + j + p) & 0xffff) for p in positions)
        else:
            s += struct.pack('<iQ', 1, 4) + b''.join(bytes([(l * 3 + p + b) & 255 for b in range(4)]) for p in positions)
    return s


def pstr(b):
    return struct.pack('<I', len(b)) + b


def record(keep, tokens, cells):
    body = struct.pack('<II', keep, len(tokens)) + b''.join(struct.pack('<i', t) for t in tokens)
    body += struct.pack('<Q', len(cells)) + cells
    return b'STEP' + body + struct.pack('<Q', checksum64(body))


def journal(records, fp=b'fp-1', key=b'k'):
    return b'ARKJ' + struct.pack('<I', 1) + pstr(fp) + pstr(key) + b''.join(records)


def pool_file(tokens, data, fp=b'fp-1', key=b'k'):
    out = b'ARKV' + struct.pack('<I', 1) + pstr(fp) + pstr(key) + struct.pack('<I', len(tokens))
    out += b''.join(struct.pack('<i', t) for t in tokens)
    out += struct.pack('<QQ', len(data), checksum64(data)) + b'\x00' + struct.pack('<Q', len(data)) + data
    return out


def write(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data if isinstance(data, bytes) else data.encode())


toks = list(range(100, 110))
write('kv_files', 'seed-journal-base', journal([record(0, toks[:6], state(range(6)))]))
write('kv_files', 'seed-journal-steps', journal([
    record(0, toks[:6], state(range(6))),
    record(6, toks[6:9], state(range(6, 9))),
    record(4, [7, 8], state(range(4, 6))),
    record(5, [], b''),
]))
write('kv_files', 'seed-journal-vtrans', journal([
    record(0, toks[:4], state(range(4), v_trans=True)),
    record(2, [1, 2, 3], state(range(2, 5), v_trans=True)),
]))
write('kv_files', 'seed-state', state(range(5)))
write('kv_files', 'seed-state-two-streams', state(range(3), seq=1).replace(struct.pack('<I', 1), struct.pack('<I', 2), 1))
write('kv_files', 'seed-pool-file', pool_file(toks[:5], state(range(5))))
write('kv_files', 'seed-torn', journal([record(0, toks[:6], state(range(6)))])[:-5])

write('mcp_messages', 'seed-tools-json', '\x00' + '{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"a","description":"d",'
      '"inputSchema":{"type":"object","properties":{"x":{"type":"string"}}}},{"name":"b"}],"nextCursor":"c2"}}')
write('mcp_messages', 'seed-call-sse', '\x01' + 'event: message\ndata: {"jsonrpc":"2.0","id":7,"result":{"content":'
      '[{"type":"text","text":"hi"},{"type":"image","data":"AA=="}],"structuredContent":{"k":1},"isError":false}}\n\n')
write('mcp_messages', 'seed-error', '\x00' + '{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"bad"}}')
write('mcp_messages', 'seed-error-not-object', '\x00' + '{"jsonrpc":"2.0","id":7,"error":5}')
write('mcp_messages', 'seed-http-404', '\x06' + '{"error":"gone"}')
write('mcp_messages', 'seed-hostile-shapes', '\x00' + '{"jsonrpc":"2.0","id":7,"result":{"tools":[1,"x",{"name":3},'
      '{"name":"c","inputSchema":[]}],"nextCursor":5,"content":"no","isError":"yes","protocolVersion":1}}')
write('mcp_messages', 'seed-sse-multiline', '\x01' + 'data: {"jsonrpc":"2.0",\r\ndata: "id":7,"result":{}}\r\n\r\n')

write('sse', 'seed-plain', '\x05\x03message{"a":1}')
write('sse', 'seed-lines', '\x02\x00ev\r\nline1\nline2\r\n\rend')
write('sse', 'seed-empty', '\x00\x00')

write('agent_spec', 'seed-agent.yaml', '''agents:
  - id: worker
    instructions: Use the tools, then answer.
    min_tool_steps: 1
    parallel_tool_calls: false
    sampling: { temperature: 0.7, seed: 3 }
    limits: { max_steps: 6, max_tokens_per_step: 96, max_context_tokens: 6000, keep_tool_outputs: 2 }
    tools:
      - name: lookup
        description: Look something up
        url: http://127.0.0.1:9/lookup
        timeout_ms: 2000
        parameters:
          type: object
          properties: { q: { type: string } }
          required: [q]
    mcp_servers:
      - url: http://127.0.0.1:9/mcp
        allowed_tools: [search]
''')
write('agent_spec', 'seed-bad.yaml', 'agents: [ { id: 1, tools: "x" }, 7, ~ ]\n')
write('agent_spec', 'seed-anchors.yaml', 'a: &a [*a]\nagents: *a\n')

write('openai_request', 'seed-chat.json', '{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user",'
      '"content":[{"type":"text","text":"hi"}]},{"role":"assistant","tool_calls":[{"id":"c1","type":"function",'
      '"function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}],'
      '"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required",'
      '"temperature":0.5,"top_p":0.9,"max_tokens":16,"stop":["x"],"logit_bias":{"5":-100},"logprobs":true,'
      '"top_logprobs":2,"seed":1,"n":1,"stream":true,"response_format":{"type":"json_object"}}')
write('openai_request', 'seed-bad-fields.json', '{"messages":[],"logit_bias":{"-1":1,"x":2},"top_logprobs":-3,'
      '"max_tokens":-1,"n":100000,"stop":5}')
write('openai_request', 'seed-schema.json', '{"messages":[{"role":"user","content":"x"}],"response_format":'
      '{"type":"json_schema","json_schema":{"name":"n","schema":{"$ref":"#"}}}}')
write('openai_request', 'seed-deep.json', '[' * 200 + ']' * 200)

write('tool_call_output', 'seed-call', '\x00<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>')
write('tool_call_output', 'seed-partial', '\x01<tool_call>\n{"name": "look')
write('tool_call_output', 'seed-text', '\x00Just an answer.')
write('tool_call_output', 'seed-huge-number', '\x00<tool_call>\n{"name": "lookup", "arguments": {"q": 1e99999}}\n</tool_call>')


def gateway_request(name, method, path, query='', headers=(), body=''):
    """method, path, query, each header as name 0x1f value, an empty field, then the body, all
    separated by 0x1e (tests/fuzz/gateway_request.cpp)."""
    parts = [method, path, query] + [k + '\x1f' + v for k, v in headers] + ['', body]
    write('gateway_request', 'seed-' + name, '\x1e'.join(parts).encode('utf-8', 'surrogateescape'))


gateway_request('chat', 'POST', '/v1/chat/completions', '', [('content-type', 'application/json'), ('authorization', 'Bearer k')],
                '{"model":"m","messages":[{"role":"user","content":"hi"}]}')
gateway_request('events-query-crlf', 'GET', '/v1/sessions/sess_abc/events',
                'last_event_id=1%0d%0aGET%20/v1/sessions/sess_x%20HTTP/1.1%0d%0aHost:%20n%0d%0a%0d%0a')
gateway_request('events-header-crlf', 'GET', '/v1/sessions/sess_abc/events', '', [('last-event-id', '1\r\nX-Evil: 1')])
gateway_request('events-ok', 'GET', '/v1/sessions/sess_abc/events', 'last_event_id=12.3')
gateway_request('header-lf', 'GET', '/v1/models', '', [('x-request-id', 'a\nGET /admin HTTP/1.1')])
gateway_request('header-nul', 'GET', '/v1/models', '', [('x-request-id', 'a\x00b')])
gateway_request('target-crlf', 'GET', '/v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /admin')
gateway_request('te-smuggle', 'POST', '/v1/chat/completions', '', [('transfer-encoding', 'chunked'), ('content-length', '5')],
                '0\r\n\r\nGET /admin HTTP/1.1\r\n\r\n')
gateway_request('cl-empty-get', 'GET', '/v1/models', '', [('content-length', '50')])
gateway_request('deep', 'POST', '/v1/chat/completions', '', [('content-type', 'application/json')], '[' * 5000)
gateway_request('bad-utf8', 'POST', '/v1/responses', '', [('content-type', 'application/json')], '{"input":"\udcff"}')
gateway_request('session-id-pct', 'DELETE', '/v1/sessions/sess%0d%0a')
gateway_request('method-space', 'GE T', '/v1/models')
gateway_request('host-override', 'GET', '/v1/models', '', [('host', 'evil'), ('connection', 'close')])
gateway_request('unknown-method', 'PURGE', '/v1/models')
