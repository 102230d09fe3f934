"use strict";
// fencegate for TypeScript and JavaScript workers, over node-postgres: thin
// over fencegate's versioned SQL interface (docs/sql.md). Enqueue an intent
// in your own transaction, fenced by your lease's epoch; acquire, renew and
// release leases; a Keeper that renews a lease in the background and aborts
// an AbortSignal, judged on the monotonic clock, when it can no longer be
// trusted. Refusals are typed errors (StaleEpochError for ZF002, …).
var __createBinding = (this && this.__createBinding) || (Object.create ? (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    var desc = Object.getOwnPropertyDescriptor(m, k);
    if (!desc || ("get" in desc ? !m.__esModule : desc.writable || desc.configurable)) {
      desc = { enumerable: true, get: function() { return m[k]; } };
    }
    Object.defineProperty(o, k2, desc);
}) : (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    o[k2] = m[k];
}));
var __exportStar = (this && this.__exportStar) || function(m, exports) {
    for (var p in m) if (p !== "default" && !Object.prototype.hasOwnProperty.call(exports, p)) __createBinding(exports, m, p);
};
Object.defineProperty(exports, "__esModule", { value: true });
__exportStar(require("./errors"), exports);
__exportStar(require("./client"), exports);
__exportStar(require("./keeper"), exports);
