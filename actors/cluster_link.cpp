// The null cluster link of one process alone.
#include "actors/cluster_link.hpp"

namespace longwave::actors {

cluster_link& no_cluster() {
  static null_cluster_link link;
  return link;
}

}  // namespace longwave::actors
