// The page of a login link that cannot be used (spent, expired, unknown). Opened again in a
// browser that is already logged in (history, a second click), it just leads to the dashboard.

import { credential, signedIn } from "./auth.js";

if (credential() && (await signedIn())) location.replace("/");
