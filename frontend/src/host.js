// TensorBoard's plugin host, seen from the tab's iframe: the messages of TensorBoard's plugin_lib
// over a MessageChannel ("experimental.bootstrap"). The host announces each data reload
// ("experimental.DataReloaded": its reload button and its auto-reload).
let port = null;
const listeners = new Map();

/** Connects to TensorBoard when the tab runs in its iframe; false when opened on its own. */
export function connectHost() {
  if (port) return true;
  if (window.parent === window) return false;
  const channel = new MessageChannel();
  port = channel.port1;
  port.onmessage = (event) => {
    let message;
    try {
      message = JSON.parse(event.data);
    } catch {
      return;
    }
    if (message.isReply) return;
    let error = null;
    try {
      listeners.get(message.type)?.(message.payload);
    } catch (e) {
      error = String(e);
    }
    port.postMessage(JSON.stringify({ type: message.type, id: message.id, payload: null, error, isReply: true }));
  };
  window.parent.postMessage('experimental.bootstrap', '*', [channel.port2]);
  return true;
}

/** Calls fn(payload) on each message `type` from the host (one listener per type). */
export function onHost(type, fn) {
  listeners.set(type, fn);
}
