// Run before main.js: if a module of main.js fails to load, main.js never runs and the
// page would say "connecting…" for ever. The usual cause is not the server: Chromium
// cuts requests in flight (ERR_NETWORK_CHANGED) when a network interface comes or goes,
// as one does at each Docker container start. So reload, a few times per tab, then say so.

const TRIES = 3;
const KEY = 'corral-load-tries';
let failed = false;

document.querySelector('script[src="main.js"]').addEventListener('error', () => {
  failed = true;
  const tries = Number(sessionStorage.getItem(KEY) || 0);
  if (tries < TRIES) {
    sessionStorage.setItem(KEY, String(tries + 1));
    location.reload();
    return;
  }
  sessionStorage.removeItem(KEY);
  const pill = document.getElementById('conn');
  pill.textContent = "error: the page's scripts did not load; reload to try again";
  pill.className = 'pill bad';
});

// Deferred scripts run (or fail) in order, before DOMContentLoaded: a load that got here
// linked main.js, and the next one starts the count afresh.
document.addEventListener('DOMContentLoaded', () => failed || sessionStorage.removeItem(KEY));
