bash tests/vm/datapath.sh > /dev/null 2>&1
ip netns exec p-lp-api0 timeout 8 tcpdump -lnei eth0 -c 4 2>&1 &
ip netns exec n1 timeout 8 tcpdump -lni lv-tenant-a -c 4 2>&1 | sed 's/^/VRF: /' &
sleep 2
ip netns exec n1 ping -c1 -W2 -m 1048576 10.30.1.2
wait
