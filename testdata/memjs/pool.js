// Used by proxy/authpool_clients_test.go: opens N memjs clients at once
// (one connection each, SASL PLAIN), each storing and reading its own key
// pool-js-I, and prints a JSON array with what each saw.
// Usage: node pool.js ADDR USER PASSWORD N
'use strict';
const memjs = require('memjs');
const [addr, user, password, n] = process.argv.slice(2);
const clients = Array.from({ length: Number(n) }, () =>
  memjs.Client.create(addr, { username: user, password: password, retries: 0, timeout: 10 }));
(async () => {
  const res = await Promise.all(clients.map(async (c, i) => {
    const key = `pool-js-${i}`;
    try {
      const ok = await c.set(key, `js ${i}`, { expires: 0 });
      const { value } = await c.get(key);
      return { set: ok, get: value === null ? null : value.toString() };
    } catch (e) {
      return { error: String(e && e.message || e) };
    }
  }));
  console.log(JSON.stringify(res));
  clients.forEach((c) => c.close());
  process.exit(0);
})();
