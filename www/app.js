// The demo: a team board on Kizuna, two devices side by side, each a client with its own local
// database, network switch, outbox and feed; scenarios that make the consistency model visible.
import init from "/pkg/kizunasync.js";
import { Device } from "./device.js";
import { DeviceView } from "./device-view.js";
import { mountScenarios } from "./scenario-view.js";

await init();
const d1 = new Device("device-1", "Device 1", "alice");
const d2 = new Device("device-2", "Device 2", "bob");
new DeviceView(document.getElementById("device-1"), d1);
new DeviceView(document.getElementById("device-2"), d2);
mountScenarios(document.getElementById("scenarios"), { d1, d2 });
// Countdowns (the next retry) move on even when nothing else happens.
setInterval(() => { d1.changed(); d2.changed(); }, 1000);
await Promise.all([d1.open(), d2.open()]);
document.body.dataset.ready = "yes";
