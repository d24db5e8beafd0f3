// The token flow: a route answering 401 asks the user for the bearer token once; it is
// sent to POST /auth in a header and exchanged for an HttpOnly cookie (never stored by
// the page, never in a URL).

import { $ } from './dom.js';

// `fn()`, asked again once after the user signed in when it failed with a 401.
export async function authed(fn) {
  try {
    return await fn();
  } catch (e) {
    if (e.status !== 401) throw e;
    await askToken();
    return fn();
  }
}

let asking = null;

// The token dialog; one at a time (two requests failing at once share it).
export function askToken() {
  if (asking) return asking;
  const dialog = $('#token-dialog');
  asking = new Promise((resolve) => {
    const submit = async () => {
      const token = $('#token').value.trim();
      try {
        const response = await fetch(new URL('../auth', location.href), {
          method: 'POST',
          headers: { Authorization: `Bearer ${token}` },
          credentials: 'same-origin',
        });
        if (!response.ok) throw new Error((await response.json()).message || response.statusText);
        $('#token').value = '';
        dialog.close();
        $('#token-submit').removeEventListener('click', submit);
        asking = null;
        resolve();
      } catch (e) {
        $('#token-error').textContent = e.message;
      }
    };
    $('#token-submit').addEventListener('click', submit);
    $('#token').onkeydown = (e) => e.key === 'Enter' && submit();
    dialog.showModal();
  });
  return asking;
}
