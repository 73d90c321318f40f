//! `lace-netns-bed`: builds the two-node SRv6 bed, shows what an operator would see on each
//! node, pings across it and tears it down. The body of `scripts/demo.sh` until the real
//! multi-node Lace demo replaces it. Run as root on a kernel with VRF (or via vmrun.sh).

use lace_netns_tests::bed::{Side, TwoNodeBed};
use lace_netns_tests::require_root_and_vrf;

fn main() -> Result<(), lace_netns_tests::bed::BedError> {
    require_root_and_vrf();
    let bed = TwoNodeBed::build()?;
    bed.install_srv6()?;
    for side in [Side::A, Side::B] {
        println!("===== {} ({})", side.node(), bed.node(side)?.name());
        print!("{}", bed.describe_node(side)?);
    }
    for (from, to) in [(Side::A, Side::B), (Side::B, Side::A)] {
        println!(
            "===== ping {} -> {} ({})",
            from.pod(),
            to.pod(),
            to.pod_v4()
        );
        print!("{}", bed.ping(from, to, false, 3)?);
    }
    for side in [Side::A, Side::B] {
        println!(
            "{}: End.DT46 {} decapsulated {} packets; fabric forwarded {} SRv6 packets to it",
            side.node(),
            side.sid(),
            bed.decap_packets(side)?,
            bed.fabric_srv6_packets_to(side)?
        );
    }
    println!("===== tearing down");
    Ok(())
}
