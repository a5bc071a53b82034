//! Tests of the pieces of the server's shell that need no sockets (key placement).

use super::*;
use bytes::Bytes;
use pushpull_proto::protocol::ReduceOp;

/// A factory that records the parameter `k` of every codec it builds.
fn recording_factory(seen: Arc<Mutex<Vec<String>>>) -> impl CodecFactory {
    move |ctx: &CodecContext<'_>| -> Result<Compressor, String> {
        let k = ctx.tensor.params.get("k").cloned().unwrap_or_default();
        seen.lock().unwrap().push(k);
        Ok(pushpull_codecs::fp32_codec(ctx.chunk.len as usize))
    }
}

fn two_chunk_placement(name: &str, len: u64, k: &str) -> TensorPlacement {
    let mut placer = pushpull_proto::placement::Placer::new(2, 400);
    let mut params = pushpull_proto::config::ParamMap::new();
    params.insert("k".into(), k.into());
    let p = placer.place(name, len, params);
    assert_eq!(p.chunks.len(), 2);
    assert_eq!(p.chunks[0].server, 0);
    p
}

#[test]
fn a_tensor_placed_again_after_a_failed_declare_gets_fresh_keys() {
    // Server 0 accepted "t" but server 1 refused it, so the declare failed; the workers
    // declare "t" again with other parameters (or another length). Server 0 must build
    // its key from the new placement, not keep the codec of the failed one, nor refuse
    // the key it still holds.
    let mut config = Config::local(2, 2);
    config.cluster.partition_bytes = 400;
    let (shared, _sender) = Shared::new(&config);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let factory = recording_factory(seen.clone());
    let first = two_chunk_placement("t", 150, "1");
    place_keys(&shared, &factory, &config, 0, 7, &first).unwrap();
    assert_eq!(*seen.lock().unwrap(), ["1"]);
    let again = two_chunk_placement("t", 150, "2");
    place_keys(&shared, &factory, &config, 0, 7, &again).unwrap();
    assert_eq!(*seen.lock().unwrap(), ["1", "2"]);
    let longer = two_chunk_placement("t", 180, "2");
    place_keys(&shared, &factory, &config, 0, 7, &longer).unwrap();
    let key = longer.chunks[0].key;
    let k = shared.keys.get(&key).unwrap().value().clone();
    assert_eq!(k.lock().unwrap().info().len, 90);
    // A key in use is never replaced: the same chunk keeps its state, another length is
    // refused; another tensor's key is refused by name.
    let acts = k
        .lock()
        .unwrap()
        .push(0, 0, ReduceOp::Sum, 0, Bytes::from(vec![0u8; 360]));
    assert!(acts.is_empty());
    let n = seen.lock().unwrap().len();
    place_keys(&shared, &factory, &config, 0, 7, &longer).unwrap();
    assert_eq!(seen.lock().unwrap().len(), n);
    assert!(k.lock().unwrap().is_open());
    let e = place_keys(&shared, &factory, &config, 0, 7, &again).unwrap_err();
    assert!(
        e.contains("already held") && e.contains("tensor \"t\" chunk 0"),
        "{e}"
    );
    assert!(k.lock().unwrap().is_open());
    let mut other = two_chunk_placement("u", 150, "2");
    other.chunks[0].key = key;
    let e = place_keys(&shared, &factory, &config, 0, 7, &other).unwrap_err();
    assert!(
        e.contains("tensor \"u\" chunk 0") && e.contains("tensor \"t\""),
        "{e}"
    );
}

#[test]
fn advertised_address_rules() {
    let bound: SocketAddr = "0.0.0.0:4000".parse().unwrap();
    let local: IpAddr = "10.0.0.7".parse().unwrap();
    assert_eq!(
        advertised_addr(Some("192.168.1.2:5000"), bound, Some(local)).unwrap(),
        "192.168.1.2:5000".parse().unwrap()
    );
    assert_eq!(
        advertised_addr(None, "127.0.0.1:4000".parse().unwrap(), Some(local)).unwrap(),
        "127.0.0.1:4000".parse().unwrap()
    );
    assert_eq!(
        advertised_addr(None, bound, Some(local)).unwrap(),
        "10.0.0.7:4000".parse().unwrap()
    );
    // An IPv4-mapped local address of a dual-stack socket is advertised as IPv4.
    let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
    assert_eq!(
        advertised_addr(None, "[::]:4000".parse().unwrap(), Some(mapped)).unwrap(),
        "10.0.0.7:4000".parse().unwrap()
    );
    let e = advertised_addr(None, bound, None).unwrap_err();
    assert!(e.contains("server.advertise"), "{e}");
    let e = advertised_addr(Some("nope"), bound, None).unwrap_err();
    assert!(e.contains("IP address and port"), "{e}");
}
