//! A client of a history, whichever kind it is: the native engine (client.rs) or the real client
//! in a browser page (browser.rs). The history drives both through these calls.

use kizuna_engine::LocalWrite;

use crate::browser::BrowserClient;
use crate::client::Client;
use crate::proxy::Proxy;
use crate::record::Record;

pub enum Device {
    Native(Box<Client>),
    Browser(BrowserClient),
}

impl Device {
    pub fn native(name: String, user: String, buckets: Vec<String>, proxy: Proxy, seed: u64) -> Device {
        Device::Native(Box::new(Client::new(name, user, buckets, proxy, seed)))
    }

    pub fn rec(&self) -> &Record {
        match self {
            Device::Native(c) => &c.rec,
            Device::Browser(b) => &b.rec,
        }
    }

    pub fn proxy(&self) -> &Proxy {
        match self {
            Device::Native(c) => &c.proxy,
            Device::Browser(b) => &b.proxy,
        }
    }

    pub async fn write(&mut self, writes: Vec<LocalWrite>) -> Result<(), String> {
        match self {
            Device::Native(c) => {
                c.write(writes);
                Ok(())
            }
            Device::Browser(b) => b.write(writes).await,
        }
    }

    /// A round of sync work, as the app's `sync()` or a timer would start it.
    pub async fn sync(&mut self) -> Result<(), String> {
        match self {
            Device::Native(c) => {
                c.step().await;
                Ok(())
            }
            Device::Browser(b) => b.sync().await,
        }
    }

    /// Pushes and pulls until nothing more is due right now.
    pub async fn sync_until_idle(&mut self) -> Result<(), String> {
        match self {
            Device::Native(c) => {
                c.engine.request_push();
                c.engine.request_pull();
                for _ in 0..20 {
                    if !c.step().await {
                        break;
                    }
                }
                Ok(())
            }
            Device::Browser(b) => b.sync().await,
        }
    }

    /// Writes still pending or dead, and the committed horizon.
    pub async fn progress(&mut self) -> Result<(usize, i64), String> {
        match self {
            Device::Native(c) => {
                let open = c.engine.status().pending as usize + c.engine.dead_letters().len();
                Ok((open, c.engine.checkpoint().horizon))
            }
            Device::Browser(b) => b.progress().await,
        }
    }

    pub async fn read(&mut self) -> Result<(), String> {
        match self {
            Device::Native(c) => {
                c.read();
                Ok(())
            }
            Device::Browser(b) => b.read().await,
        }
    }

    pub async fn reload(&mut self, buckets: Option<Vec<String>>) -> Result<(), String> {
        match self {
            Device::Native(c) => {
                c.reload(buckets);
                Ok(())
            }
            Device::Browser(b) => b.reload(buckets).await,
        }
    }

    pub async fn push_then_reload(&mut self) -> Result<(), String> {
        match self {
            Device::Native(c) => {
                c.push_then_reload().await;
                Ok(())
            }
            Device::Browser(b) => b.push_then_reload().await,
        }
    }

    pub fn is_online(&self) -> bool {
        match self {
            Device::Native(c) => c.engine.is_online(),
            Device::Browser(b) => b.online,
        }
    }

    /// What the browser reports as its connectivity (`navigator.onLine`).
    pub async fn set_online(&mut self, online: bool) -> Result<(), String> {
        match self {
            Device::Native(c) => {
                c.engine.set_online(online);
                Ok(())
            }
            Device::Browser(b) => b.set_online(online).await,
        }
    }

    /// Everything the device heard is in its record.
    pub async fn finish(&mut self) -> Result<(), String> {
        match self {
            Device::Native(_) => Ok(()),
            Device::Browser(b) => b.drain().await,
        }
    }

    pub async fn close(self) -> Result<(), String> {
        match self {
            Device::Native(_) => Ok(()),
            Device::Browser(b) => b.close().await,
        }
    }
}
