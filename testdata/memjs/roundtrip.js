// Used by proxy/clients_test.go: authenticates with SASL PLAIN through the
// proxy, writes KEY=VALUE, reads it back, and prints a JSON line with what
// it saw. Usage: node roundtrip.js ADDR USER PASSWORD KEY [VALUE]
// Without VALUE it only reads KEY.
'use strict';
const memjs = require('memjs');
const [addr, user, password, key, value] = process.argv.slice(2);
const client = memjs.Client.create(addr, { username: user, password: password, retries: 0, timeout: 30 });
function done(out, code) {
  console.log(JSON.stringify(out));
  client.close();
  process.exit(code);
}
(async () => {
  try {
    if (value !== undefined) {
      const ok = await client.set(key, value, { expires: 0 });
      if (!ok) return done({ error: 'set failed' }, 1);
    }
    const { value: got } = await client.get(key);
    done({ value: got === null ? null : got.toString() }, 0);
  } catch (e) {
    done({ error: String(e && e.message || e) }, 1);
  }
})();
