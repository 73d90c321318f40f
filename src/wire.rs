//! Wire types shared by the CNI plugin and the node agent. Builds without kube, tokio or
//! rtnetlink so the plugin binary stays small.
